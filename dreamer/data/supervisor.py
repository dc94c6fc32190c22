"""A collector that survives its workers: a dead worker is restarted or reported, never waited on.

torchrl's ``MultiAsyncCollector`` polls its output queue with a 1 s timeout and
checks ``proc.is_alive()`` of every worker on each timeout and after each
batch; a dead worker raises ``RuntimeError("At least one process failed: ...")``
(after it terminates the others). :class:`SupervisedCollector` turns that into
a restart (a fresh collector built with the current policy weights) or one
clear error.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Callable, Iterator

from tensordict import TensorDictBase
from torch import nn
from torchrl.collectors import BaseCollector

from dreamer.data.collectors import publish_pending_weights
from dreamer.errors import UserError
from torchrl_ext import ReceiverDied

log = logging.getLogger("dreamer")
WORKER_DIED = "At least one process failed"
# What talking to a dead worker raises (its queues and pipes are closed).
WORKER_GONE = (ReceiverDied, BrokenPipeError, EOFError, ConnectionError)


class WorkerDied(UserError):
    """A collector worker process died and the run may not restart it."""


class SupervisedCollector:
    """Endless batches from ``build()``; rebuilds it when a worker dies.

    ``build(collected)`` returns a new collector; ``collected`` is the agent steps
    the collectors before it delivered (0 at the start), so a collector rebuilt
    during the random prefill takes only the random steps still owed. ``should_stop()`` is asked
    before restarting: workers that die because the run is being stopped
    (e.g. a process-group SIGTERM) are not restarted.
    """

    def __init__(
        self, build: Callable[[int], BaseCollector], *, restart: bool, max_restarts: int,
        should_stop: Callable[[], bool] = lambda: False, weights_source: nn.Module | None = None,
    ):
        self.build = build
        # Where pushed weights come from when the workers hold a copy of the policy
        # on another device (dreamer.data.collectors.worker_policy); None: their own.
        self.weights_source = weights_source
        self.restart = restart
        self.max_restarts = max_restarts
        self.should_stop = should_stop
        self.restarts = 0
        self.collected = 0  # agent steps delivered so far
        self.collector = build(0)

    def __iter__(self) -> Iterator[TensorDictBase]:
        while True:
            try:
                for batch in self.collector:
                    self.collected += batch.numel()
                    yield batch
                return
            except RuntimeError as err:
                if WORKER_DIED not in str(err):
                    raise
                reason = str(err).split(": ", 1)[-1].split(".")[0]  # "worker 0 (exit code -9)"
            with contextlib.suppress(Exception):  # its processes are already gone
                self.collector.shutdown()
            if self.should_stop():
                return
            if not self.restart:
                raise WorkerDied(
                    f"collector {reason} died and collector.restart_on_failure=false, so the run stopped"
                )
            if self.restarts >= self.max_restarts:
                raise WorkerDied(
                    f"collector {reason} died after {self.restarts} restarts "
                    f"(collector.max_restarts={self.max_restarts}); check the env for crashes"
                )
            self.restarts += 1
            log.warning("collector %s died; restarting the collector (%d/%d)",
                        reason, self.restarts, self.max_restarts)
            self.collector = self.build(self.collected)

    def update_policy_weights_(self) -> None:
        """Push the learner's weights to the workers; never waits for them (a push
        still in flight completes at a later :meth:`publish_pending_weights`)."""
        try:
            if self.weights_source is not None:
                self.collector.update_policy_weights_(self.weights_source)
            else:
                self.collector.update_policy_weights_()
        except WORKER_GONE:
            pass  # a worker died: the next batch fetch notices it (and restarts or stops)

    def publish_pending_weights(self) -> None:
        """Complete a staged weight push once it is ready; costs a few checks, never waits."""
        try:
            publish_pending_weights(self.collector)
        except WORKER_GONE:
            pass

    def shutdown(self) -> None:
        self.collector.shutdown()

"""Shared-memory weight syncs: one whose synchronous send gives up on a dead worker, and
one whose send never waits (staged, published once ready).

Upstream ``SharedMemWeightSyncScheme.send`` (sync=True) waits for each
worker's acknowledgement with ``queue.get()`` and no timeout: a worker killed
between two weight pushes (OOM killer, segfault) hangs the sender forever.
:class:`LivenessCheckedSharedMemWeightSyncScheme` polls the acknowledgement
queue and asks ``is_alive(worker_idx)`` between polls; a dead worker raises
:class:`ReceiverDied` instead of blocking. On the worker's side it stops its
receiver thread before the worker's interpreter finalises (see
:meth:`LivenessCheckedSharedMemWeightSyncScheme._start_background_receiver`).
"""

from __future__ import annotations

import atexit
import queue
import time
from typing import Callable

import torch
from tensordict import TensorDictBase
from torchrl.weight_update import SharedMemWeightSyncScheme
from torchrl.weight_update.weight_sync_schemes import WeightSyncScheme


class ReceiverDied(RuntimeError):
    """The worker whose acknowledgement the sender waited for is dead."""


class LivenessCheckedSharedMemWeightSyncScheme(SharedMemWeightSyncScheme):
    """``SharedMemWeightSyncScheme`` with a bounded, liveness-checked acknowledgement wait.

    Set ``is_alive`` (worker index -> bool) once the worker processes exist;
    until then the wait behaves like upstream's.
    """

    poll_interval_s = 0.5

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.is_alive: Callable[[int], bool] | None = None

    def __getstate__(self):
        state = dict(super().__getstate__())
        state["is_alive"] = None  # process handles stay on the sender
        return state

    def _start_background_receiver(self) -> None:
        """Upstream's daemon receiver thread, stopped and joined when the worker's interpreter
        exits. Left running, a push that arrives as the worker closes has the thread inside a
        torch op (the GIL released) when finalisation starts; CPython then ends the thread with
        ``pthread_exit``, whose unwinding through torch's C++ frames aborts the worker
        ("terminate called without an active exception")."""
        super()._start_background_receiver()
        # The base class's shutdown: it stops and joins the receiver thread (the push in hand
        # finishes). Not SharedMemWeightSyncScheme's: from a worker it would send "stop" to
        # every worker's receiver and close queues the sender still uses.
        atexit.register(WeightSyncScheme.shutdown, self)

    def _wait_for_ack(self, worker_ids=None, timeout=None) -> None:
        if self.is_alive is None or not self._ack_queues:
            return super()._wait_for_ack(worker_ids=worker_ids, timeout=timeout)
        if worker_ids is None:
            targets = list(self._ack_queues)
        elif isinstance(worker_ids, int):
            targets = [worker_ids]
        else:
            targets = list(worker_ids)
        for idx in targets:
            while True:
                try:
                    self._ack_queues[idx].get(timeout=self.poll_interval_s)
                    break
                except queue.Empty:
                    if not self.is_alive(idx):
                        raise ReceiverDied(f"worker {idx} died before acknowledging new weights") from None


class NonBlockingSharedMemWeightSyncScheme(LivenessCheckedSharedMemWeightSyncScheme):
    """A shared-memory weight sync whose ``send`` never waits.

    Upstream's synchronous ``send`` copies the weights into the shared buffers
    (a blocking device-to-host copy for a GPU learner), puts a "receive"
    instruction in every worker's queue and then waits for each worker's
    acknowledgement. Here ``send`` only stages the weights:

    - weights on a GPU are copied into a page-locked host staging copy with
      ``non_blocking=True`` on the current stream, and an event is recorded
      after the copy (the optimiser steps queued later on that stream cannot
      change what the copy reads);
    - the staged weights are published (copied into the shared buffers, the
      instruction sent) once that event has completed and every worker has
      acknowledged the previous push, checked without waiting, now or at a
      later :meth:`publish_ready`, which the caller polls (e.g. once per update).
      Until then the workers act with the previous weights; a newer ``send``
      replaces what is staged.

    Weights already on the host are staged as they are (no copy) and published
    from the live tensors. The per-worker and ``worker_ids`` forms of ``send``
    keep upstream's synchronous behaviour.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._staged: TensorDictBase | None = None  # what the next publish copies into the shared buffers
        self._staged_ready = None  # CUDA event after the copy into the staging tensors; None: ready
        self._host_staging: TensorDictBase | None = None  # page-locked, reused by every push
        self._awaiting_ack: set[int] = set()

    def __getstate__(self):
        state = dict(super().__getstate__())
        # Sender-side only: pinned tensors and CUDA events stay in this process.
        state.update(_staged=None, _staged_ready=None, _host_staging=None, _awaiting_ack=set())
        return state

    def send(self, weights=None, worker_ids=None) -> None:
        per_worker = isinstance(weights, dict) and weights and all(isinstance(k, int) for k in weights)
        if worker_ids is not None or per_worker:
            self.wait_until_published()
            return super().send(weights, worker_ids)
        # Upstream's extraction (views of the source's tensors, nothing copied), without
        # SharedMemWeightSyncScheme.prepare_weights's immediate copy into the shared buffers.
        fresh = WeightSyncScheme.prepare_weights(self, weights, self._model_id, self._strategy, self.context)
        if fresh is None:
            return
        self._stage(fresh.detach())
        self.publish_ready()

    def _stage(self, fresh: TensorDictBase) -> None:
        device = cuda_device_of(fresh)
        if device is None:
            self._staged, self._staged_ready = fresh, None
            return
        if self._host_staging is None:
            self._host_staging = fresh.apply(lambda t: torch.empty_like(t, device="cpu").pin_memory())
        self._host_staging.update_(fresh, non_blocking=True)
        self._staged_ready = torch.cuda.Event()
        self._staged_ready.record(torch.cuda.current_stream(device))
        self._staged = self._host_staging

    def publish_ready(self) -> bool:
        """Publish the staged weights if their copy is done and every worker acknowledged
        the previous push; never waits. True when it published."""
        if self._staged is None:
            return False
        if self._staged_ready is not None and not self._staged_ready.query():
            return False
        self._collect_acks()
        if self._awaiting_ack:
            return False
        for shared in self.shared_transport.unique_weights:
            if not _same_memory(shared, self._staged):  # same-device workers read the source itself
                shared.data.update_(self._staged.data)
        self._staged, self._staged_ready = None, None
        self._send_instruction(instruction="receive")
        self._awaiting_ack = set(self._instruction_queues)
        return True

    def wait_until_published(self, poll_s: float = 0.01) -> None:
        """Block until the staged weights are published and every worker acknowledged them."""
        while self._staged is not None and not self.publish_ready():
            time.sleep(poll_s)
        while self._awaiting_ack:
            self._collect_acks()
            if self._awaiting_ack:
                time.sleep(poll_s)

    def _collect_acks(self) -> None:
        """Take the acknowledgements that arrived, without waiting; a worker that died
        before acknowledging raises :class:`ReceiverDied`."""
        for idx in sorted(self._awaiting_ack):
            try:
                self._ack_queues[idx].get_nowait()
                self._awaiting_ack.discard(idx)
            except queue.Empty:
                if self.is_alive is not None and not self.is_alive(idx):
                    raise ReceiverDied(f"worker {idx} died before acknowledging new weights") from None


def cuda_device_of(weights: TensorDictBase) -> torch.device | None:
    """The CUDA device of the first weight on one, or None when all are on the host."""
    return next((t.device for t in weights.values(True, True) if t.is_cuda), None)


def _same_memory(a: TensorDictBase, b: TensorDictBase) -> bool:
    """Every leaf of ``a`` is the memory of ``b``'s leaf of the same name."""
    for key, leaf in a.items(True, True):
        other = b.get(key, None)
        if not isinstance(other, torch.Tensor) or other.data_ptr() != leaf.data_ptr():
            return False
    return True

"""A shared-memory weight sync whose synchronous send gives up on a dead worker.

Upstream ``SharedMemWeightSyncScheme.send`` (sync=True) waits for each
worker's acknowledgement with ``queue.get()`` and no timeout: a worker killed
between two weight pushes (OOM killer, segfault) hangs the sender forever.
:class:`LivenessCheckedSharedMemWeightSyncScheme` polls the acknowledgement
queue and asks ``is_alive(worker_idx)`` between polls; a dead worker raises
:class:`ReceiverDied` instead of blocking.
"""

from __future__ import annotations

import queue
from typing import Callable

from torchrl.weight_update import SharedMemWeightSyncScheme


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

"""Multi-process collectors: one whose shutdown also shuts down its weight sync
schemes, one that says which worker collected each batch.


Upstream ``MultiAsyncCollector.shutdown`` stops the workers and closes its pipes
but leaves each ``SharedMemWeightSyncScheme`` to ``__del__``. A scheme still
alive when Python exits (held in a reference cycle, as a collector and its
scheme often are) is shut down during interpreter finalization, where its
``queue.put("stop")`` starts a multiprocessing feeder thread that never runs:
the process hangs at exit after its work is done.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torchrl.collectors import MultiAsyncCollector

# (frames,) int64: the index of the worker that collected the batch (WorkerTaggingMultiAsyncCollector).
WORKER_KEY = ("collector", "worker")


class SchemeClosingMultiAsyncCollector(MultiAsyncCollector):
    """``MultiAsyncCollector`` that shuts its weight sync schemes down with its workers."""

    def shutdown(self, *args, **kwargs) -> None:
        try:
            super().shutdown(*args, **kwargs)
        finally:
            # After the workers: a scheme's "stop" instruction then reaches no one,
            # and its queues are closed while threads can still start.
            for scheme in (getattr(self, "_weight_sync_schemes", None) or {}).values():
                scheme.shutdown()


class WorkerTaggingMultiAsyncCollector(MultiAsyncCollector):
    """``MultiAsyncCollector`` whose batches carry the index of the worker that collected
    them under :data:`WORKER_KEY`. Upstream's iterator knows it (each batch arrives with
    it) but yields the batch alone; with one env per worker it names the env whose
    consecutive steps the batch holds, so a consumer can keep each env's steps apart."""

    def _get_from_queue(self, timeout=None) -> tuple[int, int, TensorDictBase]:
        idx, j, out = super()._get_from_queue(timeout)
        if out is not None:  # a clone of the worker's buffer (or its own batch): ours to extend
            out.set(WORKER_KEY, torch.full(out.batch_size, idx, dtype=torch.long, device=out.device))
        return idx, j, out

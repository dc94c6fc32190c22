"""A multi-process collector whose shutdown also shuts down its weight sync schemes.

Upstream ``MultiAsyncCollector.shutdown`` stops the workers and closes its pipes
but leaves each ``SharedMemWeightSyncScheme`` to ``__del__``. A scheme still
alive when Python exits (held in a reference cycle, as a collector and its
scheme often are) is shut down during interpreter finalization, where its
``queue.put("stop")`` starts a multiprocessing feeder thread that never runs:
the process hangs at exit after its work is done.
"""

from __future__ import annotations

from torchrl.collectors import MultiAsyncCollector


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

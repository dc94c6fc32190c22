"""Updates and frames per second of the learning phase, evaluation time excluded.

The steady phase starts when learning starts (after the random prefill and any
foreground compile); ``overall`` rates count from there, ``interval`` rates from
the previous log record, so a run slowing down shows at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Mark:
    """Where a rate counts from: the clock, the counters, and the evaluation seconds then."""

    clock: float
    updates: int
    frames: int
    eval_s: float


class Throughput:
    """Rates from host counters only (no device sync)."""

    def __init__(self):
        self.start: Mark | None = None  # the steady phase's start; None until learning starts
        self.last: Mark | None = None  # the previous log record

    def begin(self, updates: int, frames: int) -> None:
        """Learning starts now; evaluation seconds count from zero."""
        self.start = self.last = Mark(time.perf_counter(), updates, frames, 0.0)

    def overall(self, updates: int, frames: int, eval_s: float) -> dict:
        """``updates_per_s`` / ``frames_per_s`` since learning started (0 when it never did)."""
        if self.start is None:
            return {"updates_per_s": 0.0, "frames_per_s": 0.0}
        per_update, per_frame = self._since(self.start, updates, frames, eval_s)
        return {"updates_per_s": per_update, "frames_per_s": per_frame}

    def interval(self, updates: int, frames: int, eval_s: float) -> dict:
        """The same since the previous call (or learning's start); empty before learning starts."""
        if self.last is None:
            return {}
        per_update, per_frame = self._since(self.last, updates, frames, eval_s)
        self.last = Mark(time.perf_counter(), updates, frames, eval_s)
        return {"updates_per_s_interval": per_update, "frames_per_s_interval": per_frame}

    @staticmethod
    def _since(mark: Mark, updates: int, frames: int, eval_s: float) -> tuple[float, float]:
        elapsed = max(time.perf_counter() - mark.clock - (eval_s - mark.eval_s), 1e-9)
        return (updates - mark.updates) / elapsed, (frames - mark.frames) / elapsed

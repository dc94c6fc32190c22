"""Non-finite updates: stop after K in a row (the skipping itself: dreamer.algos.nonfinite).

The learner skips a non-finite optimiser step on the device and counts it
(:class:`dreamer.algos.nonfinite.NonFiniteGuard`); the counts are read at the
log-interval sync, and that is where K consecutive skips stop the run.

Because skipped steps never touch the weights or the optimiser state, the
state at that point is the state from before the first bad update; it is
written as the final checkpoint and the error points to it.
"""

from __future__ import annotations

from pathlib import Path

from dreamer.errors import UserError


class Diverged(UserError):
    """K consecutive updates were non-finite; the run stopped."""


def stop_if_diverged(record: dict, limit: int, save_checkpoint) -> None:
    """At a log sync: K skips in a row -> final checkpoint, then one clear error naming it."""
    streak = int(record.get("nonfinite_streak", 0))
    if streak < limit:
        return
    path: Path = save_checkpoint()
    raise Diverged(
        f"{streak} consecutive updates had non-finite losses or gradients (train.stop_after_nonfinite="
        f"{limit}, by update {record['updates']}); they were skipped, so the weights and optimiser state "
        f"from before the first of them are saved in {path}. Check rewards/observations for inf/NaN "
        "or lower the learning rates before training from it"
    )

"""Non-finite losses and gradients: skip the step on the device, count it, stop after K in a row.

An optimiser step is skipped the way ``torch.amp.GradScaler`` does it: the
fused Adam kernel takes a ``found_inf`` tensor and leaves weights, moments and
step count untouched when it is 1. The flag is computed on the device from the
clipped gradient norm (NaN/inf loss -> NaN/inf gradients -> non-finite norm),
so no update waits for the host. Counts stay on the device and are read at the
log-interval sync; that is where K consecutive skips stop the run.

Because skipped steps never touch the weights or the optimiser state, the
state at that point is the state from before the first bad update; it is
written as the final checkpoint and the error points to it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dreamer.errors import UserError


class NonFiniteGuard:
    """Device-side counters of skipped updates (no host sync per update)."""

    def __init__(self, device: torch.device):
        self.skipped = torch.zeros((), device=device)  # updates skipped since the last flush
        self.streak = torch.zeros((), device=device)  # consecutive skipped updates, now
        self.longest = torch.zeros((), device=device)  # longest streak since the last flush

    def observe(self, found_inf: torch.Tensor) -> None:
        """``found_inf``: 0./1. per optimiser of one update; any 1 counts the update as skipped."""
        bad = found_inf.amax()
        self.skipped.add_(bad)
        self.streak.add_(1).mul_(bad)
        torch.maximum(self.longest, self.streak, out=self.longest)

    def counts(self) -> dict[str, torch.Tensor]:
        """Device scalars for the log record (read in the interval's one host transfer)."""
        return {"updates_skipped_nonfinite": self.skipped, "nonfinite_streak": self.longest}

    def reset(self) -> None:
        self.skipped.zero_()
        self.longest.copy_(self.streak)  # an ongoing streak carries into the next interval


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

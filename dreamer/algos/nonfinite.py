"""Non-finite losses and gradients: skip the step on the device and count it.

A phase whose gradient norm is NaN/inf (NaN/inf loss -> NaN/inf gradients ->
non-finite norm) must leave weights, moments and step counts exactly as they
were, without the update waiting for the host. Both algorithms' optimisers read
a ``found_inf`` device scalar in their step and do nothing when it is 1, the way
``torch.amp.GradScaler`` skips: fused Adam (V1) in its kernel,
:class:`torchrl_ext.optim.SkippableDreamerV3Optimizer` (V3's LaProp/AGC) with a
device step count and masked moments. A finite step costs (almost) nothing extra.

:class:`NonFiniteGuard` counts skipped updates on the device; the counts are
read at the log-interval sync, where K consecutive skips stop the run
(``dreamer.run.health.stop_if_diverged``). Because skipped steps never touch
the weights or the optimiser state, the state at that point is the state from
before the first bad update; it is written as the final checkpoint.
"""

from __future__ import annotations

import abc

import torch


class NonFinitePolicy(abc.ABC):
    """How an optimiser's step is skipped when ``found_inf`` (a 0./1. device scalar) is 1."""

    @abc.abstractmethod
    def step(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor], found_inf: torch.Tensor) -> None:
        """Step ``optimizer`` (over ``params``) unless ``found_inf``; no host sync."""


def reads_found_inf(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step()`` honours ``optimizer.found_inf``: the fused Adam
    kernels (CUDA and CPU) do, as does an optimiser that says so; a foreach or
    for-loop Adam would ignore it and step on NaN gradients."""
    return bool(optimizer.defaults.get("fused")) or getattr(optimizer, "reads_found_inf", False)


class SkipInStep(NonFinitePolicy):
    """The optimiser reads ``found_inf`` in its step and skips, as GradScaler has fused Adam do."""

    def step(self, optimizer, params, found_inf) -> None:
        if not reads_found_inf(optimizer):
            raise TypeError(
                f"SkipInStep needs an optimiser whose step reads found_inf (fused=True Adam, "
                f"SkippableDreamerV3Optimizer), got {type(optimizer).__name__}"
            )
        masked_step = getattr(optimizer, "masked_step", None)
        if masked_step is not None:  # no step hooks: nothing a compiled update must drop
            masked_step(found_inf)
            return
        optimizer.found_inf = found_inf
        optimizer.step()


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

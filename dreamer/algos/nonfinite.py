"""Non-finite losses and gradients: skip the step on the device and count it.

A phase whose gradient norm is NaN/inf (NaN/inf loss -> NaN/inf gradients ->
non-finite norm) must leave weights, moments and step counts exactly as they
were, without the update waiting for the host. How depends on the optimiser,
so each algorithm picks a :class:`NonFinitePolicy`:

- :class:`SkipInKernel` (V1, fused Adam): the kernel takes a ``found_inf``
  tensor and does nothing when it is 1, the way ``torch.amp.GradScaler`` skips;
- :class:`UndoOnDevice` (V3, TorchRL's LaProp/AGC ``DreamerV3Optimizer``, which
  has no ``found_inf`` input): the step is taken and then undone on the device.

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


class SkipInKernel(NonFinitePolicy):
    """Fused Adam reads ``found_inf`` in its kernel and skips the step, as GradScaler does."""

    def step(self, optimizer, params, found_inf) -> None:
        # Only the fused kernels (CUDA and CPU) read found_inf; a foreach or
        # for-loop Adam would ignore it and step on NaN gradients.
        if not optimizer.defaults.get("fused"):
            raise TypeError(f"SkipInKernel needs a fused optimiser (fused=True), got {type(optimizer).__name__}")
        optimizer.found_inf = found_inf  # read by the fused Adam kernel, as GradScaler does
        optimizer.step()


def _optimizer_tensors(params: list, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Parameters and the optimiser's state tensors: what a step changes."""
    state = [v for p in params for v in opt.state.get(p, {}).values() if isinstance(v, torch.Tensor)]
    return list(params) + state


def _undo_where(found_inf: torch.Tensor, tensors: list[torch.Tensor], before: list[torch.Tensor]) -> None:
    """Put back ``before`` where ``found_inf`` is 1, on the device (no host sync)."""
    skip = found_inf.bool()
    with torch.no_grad():
        for now, then in zip(tensors, before):
            now.copy_(torch.where(skip, then, now))


class UndoOnDevice(NonFinitePolicy):
    """For optimisers with no ``found_inf`` input (TorchRL's LaProp/AGC): a
    non-finite step is taken and then undone, so weights and moments end
    exactly as they were."""

    def step(self, optimizer, params, found_inf) -> None:
        tensors = _optimizer_tensors(params, optimizer)
        before = list(torch._foreach_mul(tensors, 1.0))  # copies, one kernel per group
        optimizer.step()
        after = _optimizer_tensors(params, optimizer)
        # State the first step created had no "before": a skipped first step leaves it at zero.
        created = after[len(before):]
        _undo_where(found_inf, after[: len(before)] + created, before + [torch.zeros_like(t) for t in created])


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

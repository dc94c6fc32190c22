"""A soft target update that a skipped (non-finite) step leaves alone, without a host sync.

TorchRL's :class:`~torchrl.objectives.utils.SoftUpdate` moves every target parameter
toward its source after each step (``target.lerp_(source, 1 - eps)``). A trainer that
skips a non-finite optimiser step on the device (a ``found_inf`` flag, as
``torch.amp.GradScaler`` sets it for fused Adam) cannot ask the host whether to call
``step()`` without waiting for the device. :class:`SkippableSoftUpdate` takes the flag:
``step(found_inf)`` moves the targets by ``(1 - eps) * (1 - found_inf)``, zero where the
update was skipped, in three foreach kernels; ``step()`` is upstream's.
"""

from __future__ import annotations

import torch
from torchrl.objectives.utils import SoftUpdate


def masked_lerp_(targets: list[torch.Tensor], sources: list[torch.Tensor], weight: float,
                 found_inf: torch.Tensor) -> None:
    """``target += weight * (source - target)`` for every pair, unless ``found_inf`` (a 0./1.
    device scalar) is 1; in place, no host sync."""
    step = torch._foreach_sub(sources, targets)
    torch._foreach_mul_(step, (1.0 - found_inf) * weight)
    torch._foreach_add_(targets, step)


class SkippableSoftUpdate(SoftUpdate):
    """:class:`~torchrl.objectives.utils.SoftUpdate` whose ``step`` may read a ``found_inf`` flag
    (see the module docstring); the same targets, sources and ``eps``/``tau``."""

    @torch.no_grad()
    def step(self, found_inf: torch.Tensor | None = None) -> None:
        if found_inf is None:
            return super().step()
        if not self.initialized:
            raise RuntimeError(f"{type(self).__name__} must be initialized (init_()) before step()")
        sources, targets = [], []
        for key, source in self._sources.items(True, True):
            key = key if isinstance(key, tuple) else (key,)
            sources.append(source.data)
            targets.append(self._targets.get(("target_" + key[0], *key[1:])).data)
        masked_lerp_(targets, sources, 1.0 - self.eps, found_inf)

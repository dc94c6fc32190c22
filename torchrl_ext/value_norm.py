"""A return normaliser whose update dynamo traces on every torch we support.

:class:`~torchrl.modules.PercentileValueNorm` (DreamerV3's return scale) takes its
quantiles with ``torch.quantile``, which torch 2.11's dynamo cannot put in a graph
(a "Data dependent operator", ``aten.equal``, inside it, whatever ``q``): under
``fullgraph=True`` the compiled actor loss fails to trace. From torch 2.12 on it
traces, and :class:`TraceablePercentileValueNorm` calls it; before, it calls
:func:`linear_quantile`, which computes what torch 2.11's ``torch.quantile`` does
with its default linear interpolation, with the same operations in the same
order (sort; rank ``q * (n - 1)`` in the input's dtype, a row holding a NaN
ranked last so that it gives NaN; lerp between the two order statistics around
the rank), so its values are that torch's bit for bit. (From torch 2.14 on,
``torch.quantile`` ranks in float64, which can move the last bit.)
"""

from __future__ import annotations

import torch
from torchrl.modules import PercentileValueNorm


def linear_quantile(x: torch.Tensor, q: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """torch 2.11's ``torch.quantile(x, q, dim=dim)`` for a 1-D ``q``: shape ``(len(q), *x.shape without dim)``."""
    ordered = x.movedim(dim, -1).sort(dim=-1).values.unsqueeze(-2)  # (..., 1, n)
    last = ordered.shape[-1] - 1
    ranks, has_nan = torch.broadcast_tensors((q * last).unsqueeze(-1), ordered.isnan().any(-1, keepdim=True))
    ranks = ranks.masked_fill(has_nan, last)  # (..., len(q), 1)
    below = ranks.long()
    weights = ranks - below
    above = ranks.ceil().long()
    ordered = ordered.expand(*ranks.shape[:-1], ordered.shape[-1])
    values = ordered.gather(-1, below).lerp(ordered.gather(-1, above), weights)
    return values.squeeze(-1).movedim(-1, 0)


class TraceablePercentileValueNorm(PercentileValueNorm):
    """:class:`~torchrl.modules.PercentileValueNorm` whose batch quantiles dynamo
    traces on every supported torch (see the module docstring): upstream's values."""

    @classmethod
    def like(cls, norm: PercentileValueNorm) -> TraceablePercentileValueNorm:
        """A copy of ``norm``: the same settings and running statistics."""
        copy = cls(shape=norm.shape, quantiles=norm.quantiles, rate=norm.rate, min_scale=norm.min_scale,
                   center=norm.center, epsilon=norm.epsilon, device=norm.low.device)
        copy.load_state_dict(norm.state_dict())
        return copy

    @torch.no_grad()
    def update(self, value_target: torch.Tensor) -> None:
        value_target = value_target.detach()
        self._check_trailing_shape(value_target)
        flat = value_target.reshape(-1, *self.shape).to(self.low.dtype)
        quantile = torch.quantile if torch.__version__ >= (2, 12) else linear_quantile
        batch_low, batch_high = quantile(flat, self._q.to(device=flat.device, dtype=flat.dtype), dim=0)
        self.low.lerp_(batch_low, self.rate)
        self.high.lerp_(batch_high, self.rate)

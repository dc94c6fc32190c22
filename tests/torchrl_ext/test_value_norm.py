"""torchrl_ext/value_norm.py: the return scale's update traces on every supported torch
(torch 2.11's dynamo cannot trace torch.quantile) and keeps upstream's values."""

from __future__ import annotations

import pytest
import torch
from torchrl.modules import PercentileValueNorm

from torchrl_ext.value_norm import TraceablePercentileValueNorm, linear_quantile

# torch.quantile ranks in the input's dtype before torch 2.14 (the releases linear_quantile
# stands in for are among them), in float64 after.
RANKS_IN_INPUT_DTYPE = torch.__version__ < (2, 14)


@pytest.mark.parametrize("shape", [(1,), (2, 1), (97, 1), (200,), (64, 3)])
@pytest.mark.parametrize("special", ["finite", "nan", "inf"])
def test_linear_quantile_is_torch_quantile(shape, special):
    g = torch.Generator().manual_seed(len(shape) * 1000 + shape[0])
    x = torch.randn(*shape, generator=g) * 30
    if special != "finite":
        x.view(-1)[shape[0] // 2] = float(special)
    for q in (torch.tensor([0.05, 0.95]), torch.rand(3, generator=g), torch.tensor([0.0, 1.0])):
        ours, torchs = linear_quantile(x, q, dim=0), torch.quantile(x, q, dim=0)
        assert ours.shape == torchs.shape
        assert torch.equal(ours.isnan(), torchs.isnan())
        if RANKS_IN_INPUT_DTYPE:
            assert torch.equal(ours.nan_to_num(), torchs.nan_to_num())
        else:  # the rank q * (n - 1) rounded once more or less: the last bit may differ
            torch.testing.assert_close(ours, torchs, rtol=1e-6, atol=0, equal_nan=True)


@pytest.mark.trace
def test_the_return_norm_update_traces_in_one_graph_and_keeps_upstreams_statistics():
    upstream = PercentileValueNorm(rate=0.3)
    ours = TraceablePercentileValueNorm.like(upstream)
    assert ours.quantiles == upstream.quantiles and ours.rate == upstream.rate
    update = torch.compile(ours.update, backend="eager", fullgraph=True)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        returns = torch.randn(16, 15, 1, generator=g) * 5
        upstream.update(returns)
        update(returns)
        assert torch.equal(ours.low, upstream.low) and torch.equal(ours.high, upstream.high)
        assert torch.equal(ours.scale(), upstream.scale())
    assert TraceablePercentileValueNorm.like(upstream).state_dict().keys() == upstream.state_dict().keys()
    assert torch.equal(TraceablePercentileValueNorm.like(upstream).high, upstream.high)

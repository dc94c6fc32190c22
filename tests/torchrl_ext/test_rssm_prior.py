"""torchrl_ext.CacheableRSSMPrior: upstream's numbers, and a compiled step AOTAutograd keeps."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from torchrl.data import Bounded
from torchrl.modules import RSSMPrior

from tests.support.spies import aot_cache_bypasses
from torchrl_ext import CacheableRSSMPrior

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

STATE, BELIEF, ACTION = 6, 8, 2


def _priors():
    spec = Bounded(-1.0, 1.0, shape=(ACTION,))
    kwargs = dict(action_spec=spec, hidden_dim=BELIEF, rnn_hidden_dim=BELIEF, state_dim=STATE, action_dim=ACTION)
    torch.manual_seed(0)
    ours = CacheableRSSMPrior(**kwargs)
    upstream = RSSMPrior(**kwargs)
    upstream.load_state_dict(ours.state_dict())
    return ours, upstream


def _inputs(batch=(5,)):
    g = torch.Generator().manual_seed(1)
    state = torch.randn(*batch, STATE, generator=g).requires_grad_()
    belief = torch.randn(*batch, BELIEF, generator=g).requires_grad_()
    action = torch.rand(*batch, ACTION, generator=g).requires_grad_()
    noise = torch.randn(*batch, STATE, generator=g)
    return state, belief, action, noise


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("batch", [(5,), ()])
def test_cacheable_prior_matches_upstream_outputs_and_gradients(autocast, batch):
    results = []
    for prior in _priors():
        state, belief, action, noise = _inputs(batch)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = prior(state, belief, action, noise)
        sum(o.float().pow(2).sum() for o in out).backward()
        grads = [state.grad, belief.grad, action.grad, *(p.grad for p in prior.parameters())]
        results.append((out, grads))
    (ours, ours_grads), (upstream, upstream_grads) = results
    for a, b in zip(ours, upstream):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b)
    for a, b in zip(ours_grads, upstream_grads):
        torch.testing.assert_close(a, b)


def test_cacheable_prior_runs_a_bf16_belief_as_upstream_does():
    """A belief left in bf16 by an autocast world model, imagined without autocast:
    upstream runs the GRU in float32 and returns the input's dtype; so must we."""
    outputs = []
    for prior in _priors():
        state, belief, action, noise = _inputs()
        outputs.append(prior(state, belief.to(torch.bfloat16), action, noise))
    for a, b in zip(*outputs):
        assert a.dtype == b.dtype == torch.float32
        torch.testing.assert_close(a, b)


def _aot_cache_bypasses(prior) -> int:
    def imagine(state, belief, action):
        # One imagined step: an autocast region in it bypasses the cache as in fifteen (and
        # each step adds C++ kernels to compile).
        _, _, state, belief = prior(state, belief, action)
        return (state.sum() + belief.sum())

    torch._dynamo.reset()
    counters.clear()
    state, belief, action, _ = _inputs()
    torch.compile(imagine, options={"triton.cudagraphs": False})(state, belief, action).backward()
    assert counters["aot_autograd"]["total"] == 1
    return aot_cache_bypasses()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_compiled_imagination_with_the_prior_is_kept_by_aotautograds_cache():
    """A warm start reloads the compiled imagination instead of re-tracing its joint
    graph: upstream's prior puts an autocast region in it, which AOTAutograd never caches."""
    ours, upstream = _priors()
    assert _aot_cache_bypasses(upstream) == 1
    assert _aot_cache_bypasses(ours) == 0

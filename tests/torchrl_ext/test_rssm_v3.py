"""torchrl_ext's DreamerV3 RSSM pieces: upstream's numbers and gradients at a lower cost.

- SplitInputBlockGRU: the block GRU without the per-block copy of its features;
- LeanRSSMRolloutV3: the world model's loop without the discarded prior sample;
- straight_through_categorical / PriorTransition: the categorical sample with a
  softmax that stays fast for few classes.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torchrl.modules import RSSMPosteriorV3, RSSMPriorV3, RSSMRolloutV3
from torchrl.modules.models.model_based import _DreamerV3BlockGRU, _straight_through_categorical

import torchrl_ext.rssm as rssm
from tests.support.gpu_checks import RSSM_FORWARDS_CUDA
from tests.support.rounding import summation_tolerance
from torchrl_ext import (
    LeanRSSMRolloutV3,
    PriorTransition,
    SplitInputBlockGRU,
    class_softmax,
    split_block_gru_inputs,
    straight_through_categorical,
)

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

STATE, BELIEF, HIDDEN, ACTION, BLOCKS = 12, 32, 8, 3, 4


def _block_grus(num_layers: int):
    """(ours, upstream): the same weights, every one moved off its initial value
    (the norm scales start at 1 and the biases at 0, which would hide a mix-up)."""
    torch.manual_seed(0)
    upstream = _DreamerV3BlockGRU(state_dim=STATE, action_dim=ACTION, hidden_dim=HIDDEN, belief_dim=BELIEF,
                                  num_blocks=BLOCKS, num_layers=num_layers, norm_eps=1e-4)
    with torch.no_grad():
        for p in upstream.parameters():
            p.add_(0.3 * torch.randn_like(p))
    ours = _DreamerV3BlockGRU(state_dim=STATE, action_dim=ACTION, hidden_dim=HIDDEN, belief_dim=BELIEF,
                              num_blocks=BLOCKS, num_layers=num_layers, norm_eps=1e-4)
    ours.load_state_dict(upstream.state_dict())
    prior = torch.nn.Module()
    prior.rnn = ours
    split_block_gru_inputs(prior)
    return prior.rnn, upstream


def _gru_inputs(batch):
    g = torch.Generator().manual_seed(1)
    return [
        torch.randn(*batch, n, generator=g).mul(scale).requires_grad_()
        for n, scale in ((STATE, 1.0), (BELIEF, 1.0), (ACTION, 2.0))  # actions beyond +-1: the clamp matters
    ]


@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("batch", [(5,), (2, 3)])
def test_split_input_block_gru_gives_upstreams_belief_and_gradients(num_layers, batch):
    ours, upstream = _block_grus(num_layers)
    assert type(ours) is SplitInputBlockGRU and type(upstream) is _DreamerV3BlockGRU
    assert ours.state_dict().keys() == upstream.state_dict().keys()
    results = []
    for gru in (ours, upstream):
        inputs = _gru_inputs(batch)
        belief = gru(*inputs)
        weights = torch.randn(belief.shape, generator=torch.Generator().manual_seed(2))
        (belief * weights).sum().backward()
        grads = [x.grad for x in inputs] + [p.grad for p in gru.parameters()]
        results.append((belief.detach(), grads))
    (ours_belief, ours_grads), (up_belief, up_grads) = results
    assert ours_belief.shape == (*batch, BELIEF)
    torch.testing.assert_close(ours_belief, up_belief, rtol=1e-5, atol=1e-6)
    assert len(ours_grads) == len(up_grads)
    for a, b in zip(ours_grads, up_grads):
        assert a is not None and b is not None
        # The first block linear sums each block's input (its belief block, then the projected
        # features) as two matmuls where upstream runs one: another order over that width.
        block_input = BELIEF // BLOCKS + 3 * HIDDEN
        torch.testing.assert_close(a, b, rtol=1e-4, atol=summation_tolerance(block_input, b.abs().max().item()))


def test_split_input_block_gru_keeps_upstreams_dtypes_under_autocast():
    ours, upstream = _block_grus(1)
    beliefs = []
    for gru in (ours, upstream):
        state, belief, action = (x.detach() for x in _gru_inputs((6,)))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            beliefs.append(gru(state, belief, action))
    assert beliefs[0].dtype == beliefs[1].dtype
    torch.testing.assert_close(beliefs[0].float(), beliefs[1].float(), rtol=0.05, atol=0.05)


def test_only_a_block_gru_prior_gets_the_split_forward():
    block = split_block_gru_inputs(RSSMPriorV3(action_shape=torch.Size([ACTION]), action_dim=ACTION,
                                               hidden_dim=HIDDEN, rnn_hidden_dim=BELIEF, num_categoricals=3,
                                               num_classes=4, recurrent_model="block_gru", num_blocks=BLOCKS))
    plain = split_block_gru_inputs(RSSMPriorV3(action_shape=torch.Size([ACTION]), action_dim=ACTION,
                                               hidden_dim=HIDDEN, rnn_hidden_dim=BELIEF, num_categoricals=3,
                                               num_classes=4, recurrent_model="gru"))
    assert type(block.rnn) is SplitInputBlockGRU
    assert type(plain.rnn) is not SplitInputBlockGRU


def _rollouts():
    torch.manual_seed(0)
    prior = TensorDictModule(
        split_block_gru_inputs(RSSMPriorV3(action_shape=torch.Size([ACTION]), action_dim=ACTION, hidden_dim=HIDDEN,
                                           rnn_hidden_dim=BELIEF, num_categoricals=3, num_classes=4, unimix=0.01,
                                           recurrent_model="block_gru", num_blocks=BLOCKS)),
        in_keys=["state", "belief", "action"],
        out_keys=[("next", "prior_logits"), ("next", "state"), ("next", "belief")],
    )
    posterior = TensorDictModule(
        RSSMPosteriorV3(hidden_dim=HIDDEN, num_categoricals=3, num_classes=4, rnn_hidden_dim=BELIEF,
                        obs_embed_dim=7, use_rms_norm=True, unimix=0.01),
        in_keys=[("next", "belief"), ("next", "encoded_latents")],
        out_keys=[("next", "posterior_logits"), ("next", "state")],
    )
    return (LeanRSSMRolloutV3(prior, posterior, reset_key="is_init"),
            RSSMRolloutV3(prior, posterior, reset_key="is_init"))


def _sequence():
    g = torch.Generator().manual_seed(3)
    batch, time = 4, 6
    is_init = torch.zeros(batch, time, 1, dtype=torch.bool)
    is_init[:, 0] = True
    is_init[1, 3] = True  # a reset inside the sequence
    return TensorDict({
        "state": torch.zeros(batch, time, 12), "belief": torch.zeros(batch, time, BELIEF),
        "action": torch.randn(batch, time, ACTION, generator=g), "is_init": is_init,
        "next": {"encoded_latents": torch.randn(batch, time, 7, generator=g)},
    }, [batch, time])


def test_lean_rollout_gives_upstreams_outputs_with_one_sample_per_step(monkeypatch):
    ours, upstream = _rollouts()
    assert ours._fast_path  # the tensor path, whose loop the subclass replaces
    samples = []
    counted = rssm.straight_through_categorical

    def counting(*args, **kwargs):
        samples.append(1)
        return counted(*args, **kwargs)

    monkeypatch.setattr(rssm, "straight_through_categorical", counting)
    outputs = []
    for rollout in (ours, upstream):
        torch.manual_seed(7)
        outputs.append(rollout(_sequence()))
    assert len(samples) == 6  # ours: the posterior's, once per step
    for key in outputs[1].keys(True, True):
        torch.testing.assert_close(outputs[0].get(key), outputs[1].get(key), rtol=1e-6, atol=1e-7, msg=str(key))
    # The same one-hot draws (the sampled states hold probabilities +- rounding of the one-hots).
    assert torch.equal(outputs[0].get(("next", "state")).round(), outputs[1].get(("next", "state")).round())
    # Same random stream afterwards: the uniforms were drawn as upstream draws them.
    torch.manual_seed(7)
    ours(_sequence())
    after_ours = torch.rand(3)
    torch.manual_seed(7)
    upstream(_sequence())
    assert torch.equal(after_ours, torch.rand(3))


def test_lean_rollout_gradients_equal_upstreams():
    ours, upstream = _rollouts()
    grads = []
    for rollout in (ours, upstream):
        rollout.zero_grad(set_to_none=True)
        torch.manual_seed(7)
        out = rollout(_sequence())
        loss = out.get(("next", "belief")).square().sum() + out.get(("next", "prior_logits")).sum() \
            + (out.get(("next", "state")) * torch.arange(12.0)).sum()
        loss.backward()
        grads.append([p.grad.clone() for p in rollout.parameters()])
    batch, time = _sequence().shape
    for a, b in zip(*grads):
        # The samples' probabilities differ by softmax rounding (class_softmax sums the classes in
        # another order), and a weight's gradient sums its batch x time rows of those.
        torch.testing.assert_close(a, b, rtol=1e-5, atol=summation_tolerance(batch * time, b.abs().max().item()))


@pytest.mark.parametrize("shape", [(64, 32, 4), (5, 3, 2), (7, 16, 16), (4, 33)])
def test_class_softmax_is_torchs_softmax(shape):
    logits = torch.randn(*shape, generator=torch.Generator().manual_seed(0)) * 3
    torch.testing.assert_close(class_softmax(logits), torch.softmax(logits, -1), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("classes", [4, 16])
def test_straight_through_sample_and_gradient_equal_upstreams(classes):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(50, 8, classes, generator=g) * 2).requires_grad_()
    uniform = torch.rand(50, 8, generator=g)
    weights = torch.randn(50, 8, classes, generator=g)
    ours = straight_through_categorical(logits, 0.01, uniform)
    (grad_ours,) = torch.autograd.grad((ours * weights).sum(), logits)
    upstream = _straight_through_categorical(logits, 0.01, uniform)
    (grad_upstream,) = torch.autograd.grad((upstream * weights).sum(), logits)
    assert torch.equal(ours.detach().round(), upstream.detach().round())  # the same one-hot draws
    assert (ours.detach().round().sum(-1) == 1).all()
    torch.testing.assert_close(ours, upstream, rtol=1e-6, atol=1e-7)
    # The softmax's backward sums p_j x weight_j over the classes, in another order on each side.
    torch.testing.assert_close(grad_ours, grad_upstream, rtol=1e-5,
                               atol=summation_tolerance(classes, weights.abs().max().item()))


def test_prior_transition_is_the_priors_forward_with_the_same_random_draws():
    torch.manual_seed(0)
    prior = RSSMPriorV3(action_shape=torch.Size([ACTION]), action_dim=ACTION, hidden_dim=HIDDEN, rnn_hidden_dim=BELIEF,
                        num_categoricals=8, num_classes=4, unimix=0.01, recurrent_model="block_gru",
                        num_blocks=BLOCKS)
    state, belief, action = (x.detach() for x in _gru_inputs((20,)))
    state = torch.zeros(20, 32)
    outputs = []
    for step in (PriorTransition(prior), prior):
        torch.manual_seed(5)
        outputs.append(step(state, belief, action))
    for ours, upstream in zip(*outputs):
        torch.testing.assert_close(ours, upstream, rtol=1e-6, atol=1e-7)
    assert torch.equal(outputs[0][1], outputs[1][1])  # the sampled one-hot states


@pytest.mark.cuda(RSSM_FORWARDS_CUDA)
@pytest.mark.parametrize("autocast", [False, True])
def test_split_block_gru_and_sampler_on_cuda_match_upstream(autocast):
    ours, upstream = (gru.cuda() for gru in _block_grus(1))
    state, belief, action = (x.detach().cuda() for x in _gru_inputs((64,)))
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        beliefs = [gru(state, belief, action) for gru in (ours, upstream)]
    assert beliefs[0].dtype == beliefs[1].dtype and beliefs[0].is_cuda
    tolerance = 0.05 if autocast else 1e-5
    torch.testing.assert_close(beliefs[0].float(), beliefs[1].float(), rtol=tolerance, atol=tolerance)
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(256, 32, 4, device="cuda", generator=g) * 2
    uniform = torch.rand(256, 32, device="cuda", generator=g)
    ours_sample = straight_through_categorical(logits, 0.01, uniform)
    upstream_sample = _straight_through_categorical(logits, 0.01, uniform)
    assert torch.equal(ours_sample.round(), upstream_sample.round())
    torch.testing.assert_close(ours_sample, upstream_sample, rtol=1e-6, atol=1e-6)

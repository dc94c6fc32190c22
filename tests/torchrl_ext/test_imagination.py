"""torchrl_ext/imagination.py: the same numbers as upstream, with no tensor tested in Python."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torchrl.modules import TanhNormal

from dreamer.algos.v1.models import build_models
from dreamer.envs.factory import close_env, make_env
from tests.support.configs import tiny_config
from tests.support.rounding import summation_tolerance
from tests.support.spies import CallCounter, aot_cache_bypasses, spy_tensor_methods
from torchrl_ext import FixedBoundsTanhNormal

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

PYTHON_TESTS_OF_TENSORS = ("__bool__", "item", "tolist", "__float__", "__int__")


@pytest.mark.parametrize("bounds", [(-2.0, 2.0), (-1.0, 1.0), (0.0, 3.0)])
@pytest.mark.parametrize("tanh_loc", [True, False])
def test_fixed_bounds_tanh_normal_is_upstreams_distribution(bounds, tanh_loc):
    g = torch.Generator().manual_seed(0)
    loc, scale = torch.randn(5, 2, generator=g), torch.rand(5, 2, generator=g) + 0.1
    low, high = torch.full((2,), bounds[0]), torch.full((2,), bounds[1])
    ours = FixedBoundsTanhNormal(loc, scale, low=low, high=high, tanh_loc=tanh_loc)
    upstream = TanhNormal(loc, scale, low=low, high=high, tanh_loc=tanh_loc)
    torch.manual_seed(1)
    a = ours.rsample()
    torch.manual_seed(1)
    b = upstream.rsample()
    torch.testing.assert_close(a, b)
    assert ((a > low) & (a < high)).all()
    torch.testing.assert_close(ours.log_prob(a), upstream.log_prob(a), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ours.deterministic_sample, upstream.deterministic_sample)


def test_fixed_bounds_tanh_normal_gradients_are_upstreams():
    """Plain-op tanh (ClampedTanhTransform): upstream's gradients wherever the clamp is not active."""
    low, high = torch.full((2,), -2.0), torch.full((2,), 2.0)
    grads = []
    for cls in (FixedBoundsTanhNormal, TanhNormal):
        g = torch.Generator().manual_seed(0)
        loc = torch.randn(64, 2, generator=g).requires_grad_()
        scale = (torch.rand(64, 2, generator=g) + 0.1).requires_grad_()
        torch.manual_seed(1)
        (cls(loc, scale, low=low, high=high, tanh_loc=True).rsample() ** 3).sum().backward()
        grads.append((loc.grad, scale.grad))
    for ours, upstream in zip(*grads):
        torch.testing.assert_close(ours, upstream)


def test_compiled_actor_sampling_is_kept_by_aotautograds_cache():
    """A warm start reloads the compiled actor loss instead of re-tracing it: no graph
    holding a custom autograd.Function (which AOTAutograd never caches) may come from
    the actor's distribution."""
    from torch._dynamo.utils import counters

    linear = torch.nn.Linear(4, 4)

    def sample(x):
        loc, scale = linear(x).chunk(2, -1)
        dist = FixedBoundsTanhNormal(loc, scale.exp(), low=torch.full((2,), -2.0),
                                     high=torch.full((2,), 2.0), tanh_loc=True)
        return dist.rsample().sum()

    torch._dynamo.reset()
    counters.clear()
    torch.compile(sample, options={"triton.cudagraphs": False})(torch.randn(8, 4)).backward()
    assert counters["aot_autograd"]["total"] == 1
    assert aot_cache_bypasses() == 0


def test_fixed_bounds_tanh_normal_tests_no_tensor_in_python(monkeypatch):
    loc, scale = torch.randn(5, 2), torch.rand(5, 2) + 0.1
    low, high = torch.full((2,), -2.0), torch.full((2,), 2.0)
    counter = CallCounter()
    spy_tensor_methods(monkeypatch, PYTHON_TESTS_OF_TENSORS, counter)
    FixedBoundsTanhNormal(loc, scale, low=low, high=high, tanh_loc=True).rsample()
    ours = counter.total()
    TanhNormal(loc, scale, low=low, high=high, tanh_loc=True).rsample()
    monkeypatch.undo()
    assert ours == 0, counter.report()
    assert counter.total() > 0  # upstream does, which is what this class is for


def test_bad_bounds_are_refused_once_at_build_time():
    with pytest.raises(ValueError, match="high > low"):
        FixedBoundsTanhNormal.check_bounds(torch.tensor([1.0]), torch.tensor([1.0]))


def test_imagined_rollout_runs_the_whole_horizon_without_testing_done(monkeypatch):
    cfg = tiny_config()
    env = make_env(cfg.env, cfg.algo, seed=0)
    try:
        models = build_models(cfg.algo, cfg.env, env, torch.device("cpu"))
    finally:
        close_env(env)
    mb_env = models.model_based_env
    start = mb_env.reset(mb_env.fake_tensordict().expand(4).clone())
    counter = CallCounter()
    spy_tensor_methods(monkeypatch, PYTHON_TESTS_OF_TENSORS, counter)
    with torch.no_grad():
        imagined = mb_env.rollout(7, policy=models.actor, auto_reset=False, tensordict=start)
    monkeypatch.undo()
    assert imagined.shape == (4, 7)
    assert counter.total() == 0, counter.report()


def _v3_models(discrete: bool):
    from dreamer.algos.v3.models import build_models as build_v3_models

    overrides = {"name": "CartPole-v1"} if discrete else {}
    cfg = tiny_config(algo="dreamer_v3", **overrides)
    env = make_env(cfg.env, cfg.algo, seed=0)
    try:
        torch.manual_seed(0)
        models = build_v3_models(cfg.algo, cfg.env, env, torch.device("cpu"))
    finally:
        close_env(env)
    with torch.no_grad():  # the reward head starts at zero (outscale 0): make every output count
        for p in models.modules.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return models


def _imagine(models, *, upstream: bool, grad: bool = False, steps: int = 6):
    from torchrl.envs import DreamerEnv
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    env = models.model_based_env
    g = torch.Generator().manual_seed(2)
    start = env.fake_tensordict().expand(5).clone()
    start.set("state", torch.randn(5, env.prior_shape[0], generator=g))
    start.set("belief", torch.randn(5, env.belief_shape[0], generator=g))
    rollout = DreamerEnv.rollout if upstream else type(env).rollout
    torch.manual_seed(3)  # the policy's and the prior's samples
    with set_exploration_type(ExplorationType.RANDOM), torch.set_grad_enabled(grad):
        env.rollout_gradients = grad
        return rollout(env, steps, policy=models.actor, auto_reset=False,
                       tensordict=env.reset(start), break_when_any_done=False)


@contextlib.contextmanager
def _recorded_reward_logits(models):
    """The reward head's outputs (two-hot logits) while the block runs, one tensor per call."""
    head = models.model_based_env.world_model[1][0].module  # (state, belief) -> reward logits
    calls = []
    hook = head.register_forward_hook(lambda module, args, logits: calls.append(logits.detach()))
    try:
        yield calls
    finally:
        hook.remove()


@pytest.mark.parametrize("discrete", [False, True])
def test_batched_reward_rollout_is_upstreams_rollout(discrete):
    """Same keys, shapes and dtypes, the same random draws: every state, belief and
    action equal bit for bit; the reward head's logits equal to float32 rounding, and
    each side's rewards are the two-hot decoding of its own logits."""
    models = _v3_models(discrete)
    with _recorded_reward_logits(models) as our_calls:
        ours = _imagine(models, upstream=False)
    with _recorded_reward_logits(models) as upstream_calls:
        upstream = _imagine(models, upstream=True)
    keys = set(upstream.keys(True, True))
    assert set(ours.keys(True, True)) == keys and ours.batch_size == upstream.batch_size == (5, 6)
    assert upstream.get(("next", "reward")).abs().sum() > 0
    for key in keys - {("next", "reward")}:
        mine, theirs = ours.get(key), upstream.get(key)
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape, key
        assert torch.equal(mine, theirs), key
    assert not ours.get(("next", "done")).any()

    # Ours scores the block in one call, upstream step by step: the reward head's matmuls
    # see (30, .) rows instead of (5, .), so their blocking, and with it the summation
    # order, differs (and differs again from CPU to CPU). The logits are where that
    # rounding stays bounded: each is a short chain of dot products, the longest over
    # the (state, belief) features. The rewards are not compared across the two: a
    # reward is a softmax-weighted sum of symexp'd bins up to ~5e8, so a logit's last bit
    # moves it by far more than float32's relative precision.
    assert len(our_calls) == 1 and len(upstream_calls) == 6
    our_logits, upstream_logits = our_calls[0], torch.stack(upstream_calls, 1)  # (5, 6, bins)
    features = models.model_based_env.world_model[1][0].in_keys  # state, belief
    widest = sum(ours.get(("next", key)).shape[-1] for key in features)
    tolerance = summation_tolerance(widest, upstream_logits.abs().max().item())
    torch.testing.assert_close(our_logits, upstream_logits, rtol=0, atol=tolerance)
    decode = models.model_based_env.world_model[1][1].module  # logits -> reward (SymExpTwoHot)
    reward = ("next", "reward")
    assert torch.equal(ours.get(reward), decode(our_logits))
    assert torch.equal(upstream.get(reward), torch.stack([decode(step) for step in upstream_calls], 1))


def test_batched_reward_rollout_keeps_pathwise_gradients():
    """With dynamics gradients the rollout is differentiated through: the actor's,
    prior's and reward head's gradients equal upstream's. (The app's imagination env
    holds the prior and reward head out of the actor's graph; here their weights in it
    take gradients, so the rollout's own graph through them is checked too.)"""
    models = _v3_models(discrete=False)
    env_weights = list(models.model_based_env.parameters())
    assert env_weights and not any(w.requires_grad for w in env_weights)
    params = [p for n, p in models.modules.named_parameters() if n.startswith("actor.")]
    params += [w.requires_grad_() for w in env_weights]
    grads = []
    for upstream in (True, False):
        out = _imagine(models, upstream=upstream, grad=True)
        objective = out.get(("next", "reward")).sum() + out.get(("next", "belief")).square().mean()
        grads.append(torch.autograd.grad(objective, params))
    assert all(g.abs().sum() > 0 for g in grads[0][:1])
    for theirs, mine in zip(*grads):
        # Gradients summed over the block round differently from per-step sums:
        # equal to rounding at the gradient's own scale.
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5 * theirs.abs().max().item())


def test_other_rollout_calls_take_upstreams_path(monkeypatch):
    """Early stopping, auto-reset or a callback are upstream's to handle."""
    from torchrl_ext import BatchedRewardDreamerEnv

    models = _v3_models(discrete=False)
    env = models.model_based_env
    fast = CallCounter()
    original = BatchedRewardDreamerEnv._batched_reward_rollout
    monkeypatch.setattr(BatchedRewardDreamerEnv, "_batched_reward_rollout",
                        lambda self, *a: (fast.record("fast"), original(self, *a))[1])
    start = env.reset(env.fake_tensordict().expand(3).clone())
    with torch.no_grad():
        env.rollout(4, policy=models.actor, auto_reset=False, tensordict=start)  # break_when_any_done unset
        env.rollout(4, policy=models.actor, auto_reset=False, tensordict=start, break_when_any_done=False,
                    callback=lambda *_: None)
        assert fast.total() == 0
        env.rollout(4, policy=models.actor, auto_reset=False, tensordict=start, break_when_any_done=False)
    assert fast.total("fast") == 1


def test_v3_imagined_rollout_tests_no_tensor_in_python(monkeypatch):
    models = _v3_models(discrete=False)
    counter = CallCounter()
    spy_tensor_methods(monkeypatch, PYTHON_TESTS_OF_TENSORS, counter)
    imagined = _imagine(models, upstream=False)
    monkeypatch.undo()
    assert imagined.shape == (5, 6)
    assert counter.total() == 0, counter.report()

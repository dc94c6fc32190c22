"""dreamer/algos/v1/learner.py and dreamer/algos/v1/models.py: updates train every part, the update
never talks to the host, actions respect the env's bounds."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch
from tensordict import TensorDict
from torch._dynamo.utils import counters
from torchrl.envs.utils import ExplorationType, set_exploration_type

from dreamer.algos.learner import MetricsAccumulator
from dreamer.algos.v1 import learner as v1_learner
from dreamer.algos.v1 import models as v1_models
from dreamer.algos.v1.learner import METRIC_NAMES, DreamerV1Learner
from dreamer.algos.v1.models import build_models
from dreamer.data.transforms import VectorAsImage
from dreamer.envs.factory import close_env, make_env
from dreamer.envs.keys import IS_FIRST
from tests.support.configs import tiny_config
from tests.support.gpu_checks import CHECKPOINT_RESUME, EAGER_UPDATES_CUDA, V1_NO_HOST_TRANSFER
from tests.support.learners import collected_steps, new_learner
from tests.support.spies import HOST_TRANSFERS, CallCounter, spy_tensor_methods
from torchrl_ext import shares_weights

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

CPU = torch.device("cpu")
PARTS = ("encoder", "decoder", "prior", "posterior", "reward", "actor", "value")


def _setup(pixels: bool, **env_overrides):
    """Tiny config, its env, and batch_size*batch_length steps the exploration
    policy collected, reduced to what the replay buffer stores."""
    cfg = tiny_config(pixels=pixels, **env_overrides)
    env = make_env(cfg.env, cfg.algo, seed=0)
    try:
        batch = collected_steps(cfg, env)
    except BaseException:
        close_env(env)
        raise
    assert batch.shape == (cfg.buffer.batch_size * cfg.buffer.batch_length,)
    return cfg, env, batch


@pytest.fixture(scope="module")
def state_setup():
    cfg, env, batch = _setup(pixels=False)
    yield cfg, env, batch
    close_env(env)


@pytest.fixture(scope="module")
def pixel_setup():
    cfg, env, batch = _setup(pixels=True)
    yield cfg, env, batch
    close_env(env)


def _learner(cfg, env, seed=0, device=CPU, autocast=None) -> DreamerV1Learner:
    return new_learner(cfg, env, seed=seed, device=device, autocast_dtype=autocast)


def _snapshot(learner):
    return {
        part: {n: p.detach().clone() for n, p in learner.models.modules[part].named_parameters()}
        for part in PARTS
    }


# -- training --------------------------------------------------------------------


@pytest.mark.parametrize("setup", ["state_setup", "pixel_setup"])
def test_updates_change_every_parameter_and_report_finite_metrics(setup, request):
    cfg, env, batch = request.getfixturevalue(setup)
    cfg = copy.deepcopy(cfg)
    # With free nats the KL is clamped and the prior head gets no gradient while
    # KL < free_nats (Dreamer's intent); without them every weight must learn.
    cfg.algo.free_nats = 0.0
    learner = _learner(cfg, env)
    before = _snapshot(learner)
    for _ in range(3):
        learner.update(batch.clone())
    for part in PARTS:
        params = dict(learner.models.modules[part].named_parameters())
        assert params, f"{part} has no parameters"
        unchanged = [n for n, p in params.items() if torch.equal(p.detach(), before[part][n])]
        assert not unchanged, f"{part}: parameters not updated: {unchanged}"
        assert all(torch.isfinite(p).all() for p in params.values()), f"{part} has non-finite weights"

    metrics = learner.flush_metrics()
    assert set(metrics) == set(METRIC_NAMES) | {"updates_skipped_nonfinite", "nonfinite_streak"}
    for name, value in metrics.items():
        assert isinstance(value, float), name
        assert math.isfinite(value), f"{name}={value}"
    assert metrics["loss_model_reco"] > 0
    assert metrics["grad_norm_world_model"] > 0
    # A flush starts a new interval.
    assert learner.flush_metrics() == {}


def test_world_model_parts_train_with_default_free_nats(state_setup):
    cfg, env, batch = state_setup
    assert cfg.algo.free_nats == 3.0  # the default
    learner = _learner(cfg, env)
    before = _snapshot(learner)
    for _ in range(2):
        learner.update(batch.clone())
    for part in PARTS:
        params = dict(learner.models.modules[part].named_parameters())
        assert any(not torch.equal(p.detach(), before[part][n]) for n, p in params.items()), part


@pytest.mark.parametrize("reward_scale", [1.0, 0.5])
def test_update_does_not_modify_the_sampled_batch(state_setup, reward_scale):
    cfg, env, batch = state_setup
    cfg = copy.deepcopy(cfg)
    cfg.algo.reward_scale = reward_scale
    learner = _learner(cfg, env)
    sample = batch.clone()
    learner.update(sample)
    assert sample.shape == batch.shape
    assert (sample == batch).all()


def test_reward_scale_is_what_the_reward_head_learns(state_setup):
    # Training with reward_scale=s on rewards r is training on rewards s*r.
    cfg, env, batch = state_setup
    scale = 0.25
    scaled_cfg = copy.deepcopy(cfg)
    scaled_cfg.algo.reward_scale = scale
    scaled_batch = batch.clone()
    scaled_batch["next", "reward"] = batch["next", "reward"] * scale

    results = []
    for c, b in ((scaled_cfg, batch), (cfg, scaled_batch)):
        learner = _learner(c, env, seed=3)
        torch.manual_seed(4)
        learner.update(b.clone())
        results.append((learner.flush_metrics(), dict(learner.models.modules.named_parameters())))
    (m_scaled, p_scaled), (m_ref, p_ref) = results
    assert m_scaled["loss_model_reward"] == pytest.approx(m_ref["loss_model_reward"], rel=1e-5)
    for name in p_ref:
        torch.testing.assert_close(p_scaled[name], p_ref[name], msg=name)


def test_metrics_accumulator_means_over_the_interval():
    acc = MetricsAccumulator(("a", "b"), CPU)
    acc.add(torch.tensor([1.0, 10.0]))
    acc.add(torch.tensor([3.0, 20.0]))
    assert acc.flush() == {"a": 2.0, "b": 15.0}
    assert acc.flush() == {}
    acc.add(torch.tensor([5.0, 7.0]))
    assert acc.flush() == {"a": 5.0, "b": 7.0}


def _params(module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def test_the_paper_v1_bootstraps_from_the_trained_critic_and_keeps_no_copy(state_setup):
    cfg, env, _ = state_setup
    learner = _learner(cfg, env)
    assert cfg.algo.slow_value_tau == 0 and learner.slow_value is None
    # The trained critic's own weights (the same memory), held out of the actor's graph.
    bootstrap = learner.actor_loss.value_model
    assert shares_weights(bootstrap, learner.models.value)
    assert not any(p.requires_grad for p in bootstrap.parameters())
    assert "slow_value" not in learner.state_dict()


def test_imagining_through_held_out_views_updates_as_holding_the_trained_modules_out(state_setup, monkeypatch):
    """The actor loss imagines and bootstraps through held-out views of the prior's, reward
    head's and critic's weights: updates (and a checkpoint load between them) match a
    learner whose loss holds the trained modules themselves out per call, exactly."""
    cfg, env, batch = state_setup
    ours = _learner(cfg, env)
    with monkeypatch.context() as patch:
        for module in (v1_models, v1_learner):
            patch.setattr(module, "held_out_view", lambda m: m)
        upstream = _learner(cfg, env)
    assert upstream.actor_loss.value_model is upstream.models.value
    initial = _snapshot(ours)
    for step in range(3):
        if step == 1:
            ours.load_state_dict(copy.deepcopy(ours.state_dict()))
        for learner in (ours, upstream):
            torch.manual_seed(step)
            learner.update(batch.clone())
    mine, theirs = _snapshot(ours), _snapshot(upstream)
    assert all(torch.equal(mine[part][n], theirs[part][n]) for part in theirs for n in theirs[part])
    assert all(any(not torch.equal(mine[part][n], initial[part][n]) for n in mine[part])
               for part in ("prior", "reward", "value"))


def test_a_slow_value_copy_is_what_returns_bootstrap_from_and_it_follows_the_critic(state_setup):
    cfg, env, batch = state_setup
    cfg = copy.deepcopy(cfg)
    cfg.algo.slow_value_tau = 0.25
    learner = _learner(cfg, env)
    critic, slow = learner.models.value, learner.slow_value
    assert all(torch.equal(s, c) for s, c in zip(_params(slow), _params(critic)))  # starts as the critic
    held = {id(p) for opt in learner.optimizers.values() for g in opt.param_groups for p in g["params"]}
    assert not held & {id(p) for p in slow.parameters()}  # no optimiser steps it

    # The actor's lambda-returns read the slow copy: shifting the copy's output moves
    # the actor loss; shifting the trained critic's does not.
    latent = learner.prepare(batch.clone())
    latent = learner._world_model_phase(latent).out.detach()

    def actor_loss() -> float:
        torch.manual_seed(3)
        return learner._weighted(learner._actor_phase(latent.clone())).item()

    def shifted(module, by: float):
        last_bias = [p for n, p in module.named_parameters() if n.endswith("bias")][-1]
        with torch.no_grad():
            last_bias += by

    base = actor_loss()
    shifted(critic, 10.0)
    assert actor_loss() == pytest.approx(base)
    shifted(critic, -10.0)
    shifted(slow, 10.0)
    assert actor_loss() != pytest.approx(base)
    shifted(slow, -10.0)

    # After an update the copy moves a quarter of the way to the critic, gradient-free.
    slow_before = _params(slow)
    learner.update(batch.clone())
    for s, old, c in zip(_params(slow), slow_before, _params(critic)):
        torch.testing.assert_close(s, old + 0.25 * (c - old))
    assert all(p.grad is None for p in slow.parameters())


@pytest.mark.gpu_acceptance(CHECKPOINT_RESUME)
@pytest.mark.parametrize("slow_value_tau", [0.0, 0.1])
def test_learner_state_dict_round_trip_continues_identically(state_setup, slow_value_tau):
    cfg, env, batch = state_setup
    cfg = copy.deepcopy(cfg)
    cfg.algo.slow_value_tau = slow_value_tau
    a = _learner(cfg, env, seed=1)
    a.update(batch.clone())
    b = _learner(cfg, env, seed=2)  # different initial weights
    # Through bytes, as a checkpoint does (an in-memory optimiser state would be
    # shared between the two learners rather than copied).
    buffer = io.BytesIO()
    torch.save(a.state_dict(), buffer)
    buffer.seek(0)
    b.load_state_dict(torch.load(buffer, weights_only=False))
    for (n, pa), (_, pb) in zip(a.models.modules.named_parameters(), b.models.modules.named_parameters()):
        assert torch.equal(pa, pb), n
    torch.manual_seed(5)
    a.update(batch.clone())
    torch.manual_seed(5)
    b.update(batch.clone())
    for (n, pa), (_, pb) in zip(a.models.modules.named_parameters(), b.models.modules.named_parameters()):
        torch.testing.assert_close(pa, pb, msg=n)
    if slow_value_tau:
        for pa, pb in zip(a.slow_value.parameters(), b.slow_value.parameters()):
            torch.testing.assert_close(pa, pb)


def test_a_checkpoint_from_before_the_slow_copy_starts_it_at_the_critic(state_setup):
    cfg, env, batch = state_setup
    paper = _learner(cfg, env, seed=1)
    paper.update(batch.clone())
    cfg = copy.deepcopy(cfg)
    cfg.algo.slow_value_tau = 0.1
    resumed = _learner(cfg, env, seed=2)
    resumed.load_state_dict(paper.state_dict())
    for s, c in zip(resumed.slow_value.parameters(), paper.models.value.parameters()):
        assert torch.equal(s, c)


# -- host syncs ------------------------------------------------------------------


def _optimizer_step_counters(learner) -> set[int]:
    # torch.optim keeps each parameter's step count as a host scalar tensor
    # (non-fused Adam); reading it is not a device sync. Only on CPU can such a
    # read be confused with a transfer, so those tensors are left out.
    return {id(s["step"]) for opt in learner.optimizers.values() for s in opt.state.values() if "step" in s}


@pytest.mark.gpu_acceptance(V1_NO_HOST_TRANSFER)
@pytest.mark.parametrize("setup", ["state_setup", "pixel_setup"])
def test_update_makes_no_host_transfer(setup, request, monkeypatch):
    cfg, env, batch = request.getfixturevalue(setup)
    learner = _learner(cfg, env)
    learner.update(batch.clone())  # warm: optimiser state exists from here on
    steps = _optimizer_step_counters(learner)
    sample = batch.clone()
    counter = CallCounter()
    spy_tensor_methods(monkeypatch, HOST_TRANSFERS, counter, ignore=lambda t: id(t) in steps)
    learner.update(sample)
    monkeypatch.undo()
    assert counter.total() == 0, f"host transfers during update: {counter.report()}"


def test_flush_metrics_is_exactly_one_host_transfer(state_setup, monkeypatch):
    cfg, env, batch = state_setup
    learner = _learner(cfg, env)
    learner.update(batch.clone())
    learner.update(batch.clone())
    counter = CallCounter()
    spy_tensor_methods(monkeypatch, HOST_TRANSFERS, counter)
    metrics = learner.flush_metrics()
    monkeypatch.undo()
    assert set(metrics) == set(METRIC_NAMES) | {"updates_skipped_nonfinite", "nonfinite_streak"}
    assert counter.total() == 1, counter.report()
    assert counter.counts["tolist"] == 1


@pytest.mark.cuda(EAGER_UPDATES_CUDA)
@pytest.mark.parametrize("setup", ["state_setup", "pixel_setup"])
def test_cuda_update_is_sync_free(setup, request):
    cfg, env, batch = request.getfixturevalue(setup)
    device = torch.device("cuda")
    learner = _learner(cfg, env, device=device)
    on_device = batch.to(device)
    learner.update(on_device.clone())  # warm
    sample = on_device.clone()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        learner.update(sample)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    metrics = learner.flush_metrics()
    assert all(math.isfinite(v) for v in metrics.values())


# -- acting ----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.trace
@pytest.mark.timeout(300)
@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
def test_updates_after_warm_up_never_trace_a_compiled_loss_again(state_setup, autocast):
    """A re-trace of the imagination cost a warm start ~13 s on the default experiment;
    warm-up also runs under the update's autocast and leaves the RNG streams alone."""
    cfg, env, batch = state_setup
    cfg = copy.deepcopy(cfg)
    cfg.compile.enabled, cfg.compile.backend, cfg.compile.warmup_iters = True, "eager", 1
    learner = _learner(cfg, env, autocast=autocast)
    learner.compile()
    torch._dynamo.reset()
    counters.clear()
    # A new model env, as in a fresh process: TorchRL's key cache empty.
    assert not learner.models.model_based_env.__dict__.get("_cache")
    rng = torch.get_rng_state()
    learner.warmup(batch.clone())
    assert torch.equal(torch.get_rng_state(), rng), "warm-up moved the RNG stream"
    traced = counters["stats"]["unique_graphs"]
    assert traced > 0
    for _ in range(2):
        learner.update(batch.clone())
    assert counters["stats"]["unique_graphs"] == traced
    assert all(math.isfinite(v) for v in learner.flush_metrics().values())


def test_continuous_actions_lie_in_env_bounds_and_use_the_full_range(state_setup):
    cfg, env, _ = state_setup
    torch.manual_seed(0)
    models = build_models(cfg.algo, cfg.env, env, CPU)
    # Large random actor weights push the squashed mean towards both ends.
    with torch.no_grad():
        for p in models.modules["actor"].parameters():
            p.normal_(0.0, 1.0)
    low = env.action_spec.space.low
    high = env.action_spec.space.high
    assert torch.equal(high, -low) and float(high.max()) > 1.0  # Pendulum: [-2, 2]
    n = 512
    obs = TensorDict(
        {"observation": torch.randn(n, 3) * 3, "belief": torch.randn(n, cfg.algo.rssm_hidden_dim),
         "step_count": torch.ones(n, 1, dtype=torch.long)},  # mid-episode: the carried belief
        batch_size=[n],
    )
    for explore, mode in [
        (True, ExplorationType.RANDOM),  # collector
        (False, ExplorationType.RANDOM),
        (False, ExplorationType.DETERMINISTIC),  # evaluation
    ]:
        with torch.no_grad(), set_exploration_type(mode):
            action = models.policy(explore)(obs.clone())["action"]
        label = f"explore={explore} mode={mode}"
        assert action.shape == (n, 1), label
        assert ((action >= low) & (action <= high)).all(), f"{label}: {action.min()}..{action.max()}"
        # Scaled to the env's bounds, not squashed into [-1, 1].
        assert action.max() > 1.0 and action.min() < -1.0, f"{label}: {action.min()}..{action.max()}"


def test_policy_carries_the_belief_to_the_next_step(state_setup):
    cfg, env, _ = state_setup
    models = build_models(cfg.algo, cfg.env, env, CPU)
    with torch.no_grad():
        rollout = env.rollout(4, models.policy(explore=False), break_when_any_done=False)
    belief, next_belief = rollout["belief"], rollout["next", "belief"]
    # Each step starts from the belief the previous step produced.
    assert torch.equal(belief[1:], next_belief[:-1])
    assert not torch.equal(next_belief[0], belief[0])


def test_acting_reads_an_episodes_first_observation_from_the_belief_training_gives_it(state_setup):
    """The world model's rollout resets at an is_first record (state, belief, action zeroed,
    then the prior's step); the acting policy starts each episode from that same belief."""
    cfg, env, _ = state_setup
    models = build_models(cfg.algo, cfg.env, env, CPU)
    with torch.no_grad():
        for p in models.modules["prior"].parameters():  # as if trained: biases no longer zero
            p.add_(torch.randn_like(p) * 0.1)
        acting = env.rollout(1, models.policy(explore=False), break_when_any_done=False)
        record = TensorDict({
            "action": torch.randn(1, 1, 1),  # whatever the previous episode did last: ignored at a reset
            IS_FIRST: torch.ones(1, 1, 1, dtype=torch.bool),
            "state": torch.randn(1, 1, cfg.algo.latent_state_dim),
            "belief": torch.randn(1, 1, cfg.algo.rssm_hidden_dim),
            "next": {"observation": VectorAsImage()(acting["observation"].reshape(1, 1, -1))},
        }, batch_size=[1, 1])
        trained = models.world_model(record)
    assert not torch.equal(acting["belief"][0], torch.zeros_like(acting["belief"][0]))
    torch.testing.assert_close(acting["belief"][0], trained["next", "belief"][0, 0])


def test_imagination_starts_from_every_replayed_steps_posterior(state_setup):
    """Dreamer V1 imagines from the posterior of every replayed step. The rollout's root
    state is each step's input instead: zeros at a sequence's start and at an episode's
    first record, a latent no observation informed, whose first imagined step the prior
    never learned for any action but the reset's zero one."""
    cfg, env, batch = state_setup
    learner = _learner(cfg, env)
    batch = batch.clone()
    batch.set(IS_FIRST, torch.zeros(batch.shape[0], 1, dtype=torch.bool))
    batch[IS_FIRST][cfg.buffer.batch_length // 2] = True  # an episode starts inside the first sequence
    starts = []
    actor_loss = learner.loss_fns["actor"]
    learner.loss_fns["actor"] = lambda td: starts.append(td.clone()) or actor_loss(td)
    learner.update(batch)
    (start,) = starts
    steps = cfg.buffer.batch_size * cfg.buffer.batch_length
    assert start.batch_size == (steps,)
    for key in ("state", "belief"):
        informed = start[key].abs().sum(-1) > 0
        assert informed.all(), f"{int((~informed).sum())} of {steps} imagination starts have a zero {key}"


def test_discrete_policy_emits_one_hot_env_actions():
    cfg, env, _ = _setup(pixels=True, backend="atari", name="Pong", action_repeat=4)
    try:
        models = build_models(cfg.algo, cfg.env, env, CPU)
        assert models.discrete
        n_actions = env.action_spec.shape[-1]
        for explore in (True, False):
            with torch.no_grad():
                rollout = env.rollout(3, models.policy(explore), break_when_any_done=False)
            action = rollout["action"]
            assert action.shape == (3, n_actions)
            assert torch.equal(action.sum(-1), torch.ones(3, dtype=action.dtype))
            assert env.action_spec.is_in(action[0])
    finally:
        close_env(env)


@pytest.mark.mujoco
def test_exploration_policy_acts_in_dm_control_from_pixels():
    cfg, env, batch = _setup(pixels=True, backend="dm_control", name="cartpole-balance")
    try:
        # The world model is single precision: what it reads back must be too.
        assert batch["action"].dtype == torch.float32
        assert batch["next", "reward"].dtype == torch.float32
        learner = new_learner(cfg, env)
        learner.update(batch.clone())
        assert all(math.isfinite(v) for v in learner.flush_metrics().values())
    finally:
        close_env(env)


def _reference_lambda_returns(reward, next_value, gamma, lmbda):
    """Dreamer's lambda-return over the imagination horizon (dim -2), by its recursion:
    G_t = r_t + gamma * ((1 - lmbda) * V_t+1 + lmbda * G_t+1), G_H-1 = r_H-1 + gamma * V_H."""
    horizon = reward.shape[-2]
    returns = torch.empty_like(reward)
    following = next_value[..., -1, :]
    for t in reversed(range(horizon)):
        bootstrap = next_value[..., t, :] if t == horizon - 1 else (
            (1 - lmbda) * next_value[..., t, :] + lmbda * following
        )
        returns[..., t, :] = reward[..., t, :] + gamma * bootstrap
        following = returns[..., t, :]
    return returns


def test_actor_targets_are_lambda_returns_over_the_imagination_horizon(state_setup):
    cfg, env, _ = state_setup
    learner = _learner(cfg, env)
    torch.manual_seed(1)
    reward = torch.randn(6, cfg.algo.imagination_horizon, 1)
    next_value = torch.randn(6, cfg.algo.imagination_horizon, 1)
    expected = _reference_lambda_returns(reward, next_value, cfg.algo.gamma, cfg.algo.lmbda)
    got = learner.actor_loss.lambda_target(reward, next_value)
    torch.testing.assert_close(got, expected)


# -- memory layout -----------------------------------------------------------------
def test_channels_last_convs_compute_the_same_update(pixel_setup):
    """NHWC conv weights change speed, not numbers: same losses and gradients."""
    cfg, env, batch = pixel_setup
    results = {}
    for layout in (False, True):
        layout_cfg = copy.deepcopy(cfg)
        layout_cfg.algo.channels_last = layout
        learner = _learner(layout_cfg, env, seed=3)
        decoder_weight = next(learner.models.modules["decoder"].decoder.parameters())
        assert decoder_weight.is_contiguous(memory_format=torch.channels_last) == layout
        wm_td, _ = learner.world_model_loss(learner.prepare(batch.clone()))
        loss = wm_td["loss_model_kl"] + wm_td["loss_model_reco"] + wm_td["loss_model_reward"]
        loss.backward()
        grads = [p.grad.clone() for part in ("encoder", "decoder")
                 for p in learner.models.modules[part].parameters()]
        results[layout] = (loss.detach(), grads)
    torch.testing.assert_close(results[True][0], results[False][0], rtol=1e-4, atol=1e-5)
    for nhwc, nchw in zip(results[True][1], results[False][1]):
        torch.testing.assert_close(nhwc, nchw, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("channels_last", [False, True])
def test_matmul_decoder_matches_torchrls_obs_decoder_outputs_gradients_and_checkpoints(channels_last):
    """The first transposed conv as a matmul is a speed change only: drop-in for TorchRL's ObsDecoder."""
    from torchrl.modules import ObsDecoder

    from torchrl_ext import MatmulObsDecoder

    torch.manual_seed(0)
    reference = ObsDecoder(channels=8, latent_dim=12)
    ours = MatmulObsDecoder(channels=8, latent_dim=12)
    ours.load_state_dict(reference.state_dict())  # same parameters, same names
    if channels_last:
        reference.to(memory_format=torch.channels_last)
        ours.to(memory_format=torch.channels_last)
    state, belief = torch.randn(3, 4, 5), torch.randn(3, 4, 7)  # [batch, time, ...]
    expected, got = reference(state, belief), ours(state, belief)
    assert got.shape == expected.shape == (3, 4, 3, 64, 64)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    grad_out = torch.randn_like(expected)
    expected.backward(grad_out)
    got.backward(grad_out)
    for (name, p_ref), p_ours in zip(reference.named_parameters(), ours.parameters()):
        # Float32 sums over 3*4*64*64 outputs in another order: tolerance relative to the
        # gradient's scale (an AVX2 box differs from an AVX-512 one by ~3e-7 of it).
        scale = p_ref.grad.abs().max().item()
        torch.testing.assert_close(p_ours.grad, p_ref.grad, rtol=1e-4, atol=1e-5 * scale, msg=name)


def test_selective_rssm_rollout_gives_torchrls_world_model_loss_and_gradients(pixel_setup):
    """Rolling out only the RSSM's keys (not the frames) changes no number the learner sees."""
    from torchrl.modules.models.model_based import RSSMRollout

    from torchrl_ext import SelectiveRSSMRollout

    cfg, env, batch = pixel_setup
    results = {}
    for cls in (SelectiveRSSMRollout, RSSMRollout):
        learner = _learner(cfg, env, seed=3)
        sequence = learner.models.world_model[0]
        ours = sequence[1]
        assert isinstance(ours, SelectiveRSSMRollout)
        sequence[1] = cls(ours.rssm_prior, ours.rssm_posterior)
        assert type(learner.models.world_model[0][1]) is cls
        torch.manual_seed(7)  # the rollout samples its states: same noise for both
        wm_td, out = learner.world_model_loss(learner.prepare(batch.clone()))
        loss = wm_td["loss_model_kl"] + wm_td["loss_model_reco"] + wm_td["loss_model_reward"]
        loss.backward()
        grads = [p.grad.clone() for p in learner.params["world_model"]]
        results[cls] = (wm_td.detach(), out.select(("next", "state"), ("next", "belief"), ("next", "pixels")), grads)
    (td_a, out_a, grads_a), (td_b, out_b, grads_b) = results.values()
    assert (td_a == td_b).all() and (out_a == out_b).all()
    for a, b in zip(grads_a, grads_b):
        assert torch.equal(a, b)


# -- non-finite updates -------------------------------------------------------------


def _optimizer_steps(learner):
    return {name: [float(s["step"]) for s in opt.state.values()] for name, opt in learner.optimizers.items()}


def test_a_non_finite_update_is_skipped_counted_and_leaves_weights_and_moments(state_setup):
    cfg, env, batch = state_setup
    learner = _learner(cfg, env)
    learner.update(batch.clone())  # one good update: optimiser state exists
    learner.flush_metrics()
    weights = {k: v.clone() for k, v in learner.models.modules.state_dict().items()}
    steps = _optimizer_steps(learner)
    poisoned = batch.clone()
    poisoned["next", "reward"][0, 0] = float("inf")  # one bad reward -> inf loss -> non-finite grads
    for _ in range(3):
        learner.update(poisoned.clone())
    after = learner.models.modules.state_dict()
    wm_parts = [k for k in weights if k.split(".")[0] in ("encoder", "decoder", "prior", "posterior", "reward")]
    assert all(torch.equal(after[k], weights[k]) for k in wm_parts)  # world model step skipped
    assert _optimizer_steps(learner)["world_model"] == steps["world_model"]
    metrics = learner.flush_metrics()
    assert metrics["updates_skipped_nonfinite"] == 3 and metrics["nonfinite_streak"] == 3

    learner.update(batch.clone())  # a good update ends the streak and steps again
    assert not all(torch.equal(learner.models.modules.state_dict()[k], weights[k]) for k in wm_parts)
    metrics = learner.flush_metrics()
    assert metrics["updates_skipped_nonfinite"] == 0
    assert metrics["nonfinite_streak"] == 3  # the streak carried in from the last interval
    learner.update(batch.clone())
    assert learner.flush_metrics()["nonfinite_streak"] == 0

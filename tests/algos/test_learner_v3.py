"""dreamer/algos/v3/learner.py and dreamer/algos/v3/models.py: V3 updates train every part,
the update never talks to the host, actions respect the env's bounds, and a
checkpointed learner continues exactly."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch
from tensordict import TensorDict
from torch._dynamo.utils import counters
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import symlog
from torchrl.objectives import DreamerV3ActorLoss

from dreamer.algos.v3 import learner as v3_learner
from dreamer.algos.v3 import models as v3_models
from dreamer.algos.v3.learner import METRIC_NAMES, DreamerV3Learner
from dreamer.algos.v3.models import build_models
from dreamer.config import validate
from dreamer.envs.factory import close_env, make_env
from dreamer.envs.keys import IS_FIRST
from dreamer.errors import UserError
from tests.support.configs import tiny_config
from tests.support.gpu_checks import EAGER_UPDATES_CUDA, V3_NO_HOST_TRANSFER
from tests.support.learners import collected_steps, new_learner
from tests.support.spies import HOST_TRANSFERS, CallCounter, spy_tensor_methods
from torchrl_ext import OneCriticPassDreamerV3ActorLoss

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

CPU = torch.device("cpu")
PARTS = ("encoder", "decoder", "prior", "posterior", "reward", "continuation", "actor", "value")


def tiny_v3_config(*, pixels: bool = False, **env_overrides):
    cfg = tiny_config(pixels=pixels, algo="dreamer_v3", **env_overrides)
    a = cfg.algo
    a.num_categoricals, a.num_classes, a.num_bins, a.mlp_layers = 4, 4, 31, 1
    # Every weight must move within a few updates: no warm-up from lr 0, and no
    # free bits (they zero the prior's gradient while the KL is small).
    a.lr_warmup_steps, a.free_bits = 0, 0.0
    return validate(cfg)


def _setup(pixels: bool = False, **env_overrides):
    """Tiny V3 config, its env, and batch_size*batch_length steps the acting
    policy collected, reduced to what the replay buffer stores."""
    cfg = tiny_v3_config(pixels=pixels, **env_overrides)
    env = make_env(cfg.env, cfg.algo, seed=0)
    try:
        return cfg, env, collected_steps(cfg, env)
    except BaseException:
        close_env(env)
        raise


@pytest.fixture(scope="module")
def state_setup():
    cfg, env, batch = _setup()
    yield cfg, env, batch
    close_env(env)


@pytest.fixture(scope="module")
def pixel_setup():
    cfg, env, batch = _setup(pixels=True)
    yield cfg, env, batch
    close_env(env)


def _learner(cfg, env, seed=0) -> DreamerV3Learner:
    return new_learner(cfg, env, seed=seed)


def _parameters(learner) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in learner.models.modules.named_parameters()}


@pytest.mark.parametrize("setup", ["state_setup", "pixel_setup"])
def test_v3_updates_change_every_part_and_report_finite_metrics(setup, request):
    cfg, env, batch = request.getfixturevalue(setup)
    learner = _learner(cfg, env)
    before = _parameters(learner)
    for _ in range(3):
        learner.update(batch.clone())
    after = _parameters(learner)
    for part in PARTS:
        names = [n for n in before if n.startswith(part + ".")]
        assert names, f"{part} has no parameters"
        unchanged = [n for n in names if torch.equal(before[n], after[n])]
        assert not unchanged, f"{part}: parameters not updated: {unchanged}"
        assert all(torch.isfinite(after[n]).all() for n in names), f"{part} has non-finite weights"
    # The slow critic follows the value weights.
    slow = learner.value_loss.target_value_model_params.flatten_keys()
    fast = learner.value_loss.value_model_params.flatten_keys()
    assert any(not torch.equal(slow[k], fast[k]) for k in fast.keys()), "slow critic is the critic"

    metrics = learner.flush_metrics()
    assert set(metrics) == set(METRIC_NAMES) | {"updates_skipped_nonfinite", "nonfinite_streak"}
    assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["loss_model_reco"] > 0 and metrics["grad_norm_world_model"] > 0
    assert learner.flush_metrics() == {}


def test_v3_update_does_not_modify_the_sampled_batch(state_setup):
    cfg, env, batch = state_setup
    learner = _learner(cfg, env)
    sample = batch.clone()
    learner.update(sample)
    assert (sample == batch).all()


def _optimizer_host_scalars(learner) -> set[int]:
    # Optimisers may keep per-parameter step counts as host scalars; reading
    # them is not a device sync, but on CPU it looks like one to the spy.
    return {
        id(v) for opt in learner.optimizers.values() for s in opt.state.values()
        for v in s.values() if torch.is_tensor(v) and v.dim() == 0
    }


@pytest.mark.gpu_acceptance(V3_NO_HOST_TRANSFER)
@pytest.mark.parametrize("actor_grad", ["auto", "reinforce"])  # reinforce: the one-critic-pass losses
@pytest.mark.parametrize("setup", ["state_setup", "pixel_setup"])
def test_v3_update_makes_no_host_transfer(setup, actor_grad, request, monkeypatch):
    cfg, env, batch = request.getfixturevalue(setup)
    cfg = copy.deepcopy(cfg)
    cfg.algo.actor_grad = actor_grad
    learner = _learner(cfg, env)
    learner.update(batch.clone())  # warm: optimiser state exists from here on
    host_scalars = _optimizer_host_scalars(learner)
    sample = batch.clone()
    counter = CallCounter()
    spy_tensor_methods(monkeypatch, HOST_TRANSFERS, counter, ignore=lambda t: id(t) in host_scalars)
    learner.update(sample)
    monkeypatch.undo()
    assert counter.total() == 0, f"host transfers during update: {counter.report()}"


@pytest.mark.cuda(EAGER_UPDATES_CUDA)
@pytest.mark.parametrize("actor_grad", ["auto", "reinforce"])  # reinforce: the one-critic-pass losses
def test_v3_cuda_update_is_sync_free(state_setup, actor_grad):
    cfg, env, batch = state_setup
    cfg = copy.deepcopy(cfg)
    cfg.algo.actor_grad = actor_grad
    device = torch.device("cuda")
    learner = new_learner(cfg, env, device=device)
    on_device = batch.to(device)
    learner.update(on_device.clone())  # warm
    sample = on_device.clone()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        learner.update(sample)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(math.isfinite(v) for v in learner.flush_metrics().values())


def test_v3_learner_state_dict_round_trip_continues_identically(state_setup):
    cfg, env, batch = state_setup
    a = _learner(cfg, env, seed=1)
    a.update(batch.clone())
    b = _learner(cfg, env, seed=2)  # different initial weights
    buffer = io.BytesIO()  # through bytes, as a checkpoint does
    torch.save(a.state_dict(), buffer)
    buffer.seek(0)
    b.load_state_dict(torch.load(buffer, weights_only=False))
    torch.testing.assert_close(b.actor_loss.retnorm.state_dict(), a.actor_loss.retnorm.state_dict())
    for step in range(2):
        torch.manual_seed(5 + step)
        a.update(batch.clone())
        torch.manual_seed(5 + step)
        b.update(batch.clone())
    pa, pb = a.models.modules.state_dict(), b.models.modules.state_dict()
    for name in pa:
        torch.testing.assert_close(pa[name], pb[name], msg=name)
    torch.testing.assert_close(
        b.value_loss.target_value_model_params.flatten_keys().to_dict(),
        a.value_loss.target_value_model_params.flatten_keys().to_dict(),
    )


# -- acting ----------------------------------------------------------------------


def test_v3_continuous_actions_fill_the_env_bounds_and_map_back_for_learning(state_setup):
    cfg, env, _ = state_setup
    torch.manual_seed(0)
    models = build_models(cfg.algo, cfg.env, env, CPU)
    low, high = env.action_spec.space.low, env.action_spec.space.high
    assert torch.equal(high, -low) and float(high.max()) > 1.0  # Pendulum: [-2, 2]
    # Large random actor weights push the tanh mean towards both ends.
    with torch.no_grad():
        for p in models.modules["actor"].parameters():
            p.normal_(0.0, 1.0)
    n = 512
    obs = TensorDict(
        {"observation": torch.randn(n, 3) * 3,
         "state": torch.zeros(n, cfg.algo.latent_state_dim),
         "belief": torch.randn(n, cfg.algo.rssm_hidden_dim),
         "step_count": torch.ones(n, 1, dtype=torch.long)},  # mid-episode: the carried belief
        batch_size=[n],
    )
    for mode in (ExplorationType.RANDOM, ExplorationType.DETERMINISTIC):  # collector, evaluation
        with torch.no_grad(), set_exploration_type(mode):
            action = models.policy(explore=mode is ExplorationType.RANDOM)(obs.clone())["action"]
        assert action.shape == (n, 1), mode
        assert ((action >= low) & (action <= high)).all(), f"{mode}: {action.min()}..{action.max()}"
        # Scaled to the env's bounds, not clipped to [-1, 1].
        assert action.max() > 1.5 and action.min() < -1.5, f"{mode}: {action.min()}..{action.max()}"
        # The learner sees the actor's own [-1, 1] scale again.
        unit = models.to_unit_actions(action)
        assert unit.min() >= -1.0 and unit.max() <= 1.0
        torch.testing.assert_close(unit * 2.0, action)  # Pendulum's bounds are [-2, 2]


@pytest.mark.parametrize("task", [{}, {"name": "CartPole-v1", "action_repeat": 1}], ids=["continuous", "discrete"])
def test_v3_policy_outscale_sets_how_much_the_first_actions_differ_between_states(task):
    """algo.policy_outscale reaches both actor heads: at the reference's 0.01 every state
    starts near one action distribution; at 1.0 random output weights spread it by state."""
    cfg = tiny_v3_config(**task)
    env = make_env(cfg.env, cfg.algo, seed=0)
    try:
        latents = TensorDict({
            "state": torch.randn(256, cfg.algo.latent_state_dim),
            "belief": torch.randn(256, cfg.algo.rssm_hidden_dim),
        }, batch_size=[256])
        spread = {}
        for outscale in (0.01, 1.0):
            cfg.algo.policy_outscale = outscale
            torch.manual_seed(0)  # the same weights but for the output layer's scale
            models = build_models(cfg.algo, cfg.env, env, CPU)
            with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
                out = models.actor(latents.clone())
            head = out["loc"] if "loc" in out.keys() else out["logits"].log_softmax(-1)
            spread[outscale] = float(head.std(0).mean())
    finally:
        close_env(env)
    assert spread[0.01] < 0.05, spread
    assert spread[1.0] > 20 * spread[0.01], spread


def test_v3_policy_carries_the_belief_to_the_next_step(state_setup):
    cfg, env, _ = state_setup
    models = build_models(cfg.algo, cfg.env, env, CPU)
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        rollout = env.rollout(4, models.policy(explore=False), break_when_any_done=False)
    belief, next_belief = rollout["belief"], rollout["next", "belief"]
    assert torch.equal(belief[1:], next_belief[:-1])
    assert not torch.equal(next_belief[0], belief[0])


def test_v3_acting_reads_an_episodes_first_observation_from_the_belief_training_gives_it(state_setup):
    """The world model's rollout resets at an is_first record (state, belief, action zeroed,
    then the prior's step); the acting policy starts each episode from that same belief."""
    cfg, env, _ = state_setup
    models = build_models(cfg.algo, cfg.env, env, CPU)
    with torch.no_grad():
        for p in models.modules["prior"].parameters():  # as if trained: biases no longer zero
            p.add_(torch.randn_like(p) * 0.1)
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        acting = env.rollout(1, models.policy(explore=False), break_when_any_done=False)
        record = TensorDict({
            "action": torch.randn(1, 1, 1),  # whatever the previous episode did last: ignored at a reset
            IS_FIRST: torch.ones(1, 1, 1, dtype=torch.bool),
            "state": torch.randn(1, 1, cfg.algo.latent_state_dim),
            "belief": torch.randn(1, 1, cfg.algo.rssm_hidden_dim),
            "next": {"observation": acting["observation"].reshape(1, 1, -1)},
        }, batch_size=[1, 1])
        trained = models.world_model(record)
    assert not torch.equal(acting["belief"][0], torch.zeros_like(acting["belief"][0]))
    torch.testing.assert_close(acting["belief"][0], trained["next", "belief"][0, 0])
    # The posterior of that first observation: the same logits in both.
    torch.testing.assert_close(acting["_posterior_logits"][0], trained["next", "posterior_logits"][0, 0])


def test_v3_discrete_actions_are_one_hot_and_train():
    cfg, env, batch = _setup(name="CartPole-v1", action_repeat=1)
    try:
        learner = _learner(cfg, env)
        assert learner.models.discrete
        action = batch["action"]
        assert action.shape[-1] == env.action_spec.shape[-1] == 2
        assert torch.equal(action.sum(-1), torch.ones(action.shape[0], dtype=action.dtype))
        assert env.action_spec.is_in(action[0])
        before = _parameters(learner)
        learner.update(batch.clone())
        learner.update(batch.clone())
        after = _parameters(learner)
        assert any(not torch.equal(before[n], after[n]) for n in before if n.startswith("actor."))
        assert all(math.isfinite(v) for v in learner.flush_metrics().values())
        # A discrete actor has no pathwise gradient through the dynamics.
        cfg.algo.actor_grad = "dynamics"
        with pytest.raises(UserError, match="algo.actor_grad=dynamics needs continuous actions") as err:
            _learner(cfg, env)
        assert "\n" not in str(err.value)
    finally:
        close_env(env)


def test_replay_value_loss_trains_the_critic_and_nothing_else(state_setup):
    """Same seed, same batch: with the replay loss only the value head ends elsewhere."""
    cfg, env, batch = state_setup
    plain = copy.deepcopy(cfg)
    plain.algo.replay_value_scale = 0.0
    learners = {}
    for name, c in (("replay", cfg), ("plain", plain)):
        learners[name] = _learner(c, env)
        torch.manual_seed(1)
        learners[name].update(batch.clone())
    with_replay, without = _parameters(learners["replay"]), _parameters(learners["plain"])
    moved = sorted({n.split(".")[0] for n in with_replay if not torch.equal(with_replay[n], without[n])})
    assert moved == ["value"]
    assert learners["replay"].flush_metrics()["loss_replay_value"] > 0
    assert learners["plain"].flush_metrics()["loss_replay_value"] == 0


@pytest.mark.parametrize("actor_grad, reinforce", [("auto", False), ("dynamics", False), ("reinforce", True)])
def test_continuous_actor_gradient_follows_algo_actor_grad(state_setup, actor_grad, reinforce):
    cfg, env, batch = state_setup
    cfg = copy.deepcopy(cfg)
    cfg.algo.actor_grad = actor_grad
    learner = _learner(cfg, env)
    assert learner.actor_loss.use_reinforce is reinforce
    before = _parameters(learner)
    learner.update(batch.clone())
    after = _parameters(learner)
    assert any(not torch.equal(before[n], after[n]) for n in before if n.startswith("actor."))


@pytest.mark.parametrize("actor_grad", ["reinforce", "dynamics"])
def test_imagination_records_autograd_only_for_a_pathwise_actor_gradient(state_setup, actor_grad):
    """REINFORCE differentiates nothing through the imagined trajectory, so its
    rollout records no graph, and the actor and value losses and gradients are
    those of a rollout that does; dynamics gradients keep the graph."""
    cfg, env, batch = state_setup
    cfg = copy.deepcopy(cfg)
    cfg.algo.actor_grad = actor_grad
    learner = _learner(cfg, env)
    env_ = learner.models.model_based_env
    assert env_.rollout_gradients is (actor_grad == "dynamics")
    prepared = learner.prepare(batch.clone())
    latent = learner._world_model_phase(prepared).out.detach()
    runs = {}
    for recorded in (True, False):
        env_.rollout_gradients = recorded
        torch.manual_seed(5)  # the policy's samples
        actor = learner._actor_phase(latent)
        value = learner._value_phase(prepared, latent, actor.out)
        grads = torch.autograd.grad(
            [learner._weighted(actor), learner._weighted(value)],
            [p for n, p in learner.models.modules.named_parameters() if n.startswith(("actor.", "value."))],
            allow_unused=True,
        )
        runs[recorded] = (torch.stack([learner._weighted(actor).detach(), learner._weighted(value).detach()]), grads)
    if actor_grad == "reinforce":
        (losses_on, grads_on), (losses_off, grads_off) = runs[True], runs[False]
        torch.testing.assert_close(losses_off, losses_on, rtol=0, atol=0)
        assert any(g is not None and g.abs().sum() > 0 for g in grads_on)
        for on, off in zip(grads_on, grads_off):
            assert (on is None) == (off is None)
            if on is not None:
                torch.testing.assert_close(off, on, rtol=0, atol=0)
    env_.rollout_gradients = actor_grad == "dynamics"
    torch.manual_seed(5)
    with torch.enable_grad():
        td = learner.imagination_starts(latent)
        traj = env_.rollout(3, learner.models.actor, auto_reset=False, tensordict=env_.reset(td.copy()))
    assert traj.get(("next", "state")).requires_grad is (actor_grad == "dynamics")


def test_a_pathwise_actor_loss_through_held_out_views_updates_as_holding_the_trained_modules_out(
    state_setup, monkeypatch
):
    """A dynamics actor loss imagines and bootstraps through held-out views of the world
    model's, continuation head's and critic's weights. They read the weights each update
    and checkpoint load leaves, so updates match those of a learner whose loss holds the
    trained modules themselves out per call (upstream's hold_out_net), exactly; and the
    actor's backward leaves no gradient on the weights it holds out."""
    cfg, env, batch = state_setup
    cfg = copy.deepcopy(cfg)
    cfg.algo.actor_grad = "dynamics"
    ours = _learner(cfg, env)
    with monkeypatch.context() as patch:
        for module in (v3_models, v3_learner):
            patch.setattr(module, "held_out_view", lambda m: m)
        upstream = _learner(cfg, env)
    assert upstream.actor_loss.value_model is upstream.models.value
    assert ours.actor_loss.value_model is not ours.models.value
    initial = _parameters(ours)
    for step in range(3):
        if step == 1:  # a checkpoint load writes the weights in place: the views read it
            ours.load_state_dict(copy.deepcopy(ours.state_dict()))
        for learner in (ours, upstream):
            torch.manual_seed(step)
            learner.update(batch.clone())
    mine, theirs = _parameters(ours), _parameters(upstream)
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[n], theirs[n]) for n in theirs)
    held_out = ("prior", "reward", "continuation", "value")  # weights the views had to follow
    assert all(any(not torch.equal(mine[n], initial[n]) for n in mine if n.startswith(f"{part}.")) for part in held_out)

    latent = ours._world_model_phase(ours.prepare(batch.clone())).out.detach()
    for p in ours.models.modules.parameters():
        p.grad = None
    ours._weighted(ours._actor_phase(latent)).backward()
    with_grad = {n.split(".")[0] for n, p in ours.models.modules.named_parameters() if p.grad is not None}
    assert with_grad == {"actor"}


def _reinforce_actor_and_value(learner, prepared, latent, *, upstream: bool):
    """Both imagined phases with upstream's actor loss or ours, from the same return
    statistics and draws: (metrics, lambda-returns, actor and value gradients, the
    critic MLP's calls)."""
    loss = learner.actor_loss
    loss.__class__ = DreamerV3ActorLoss if upstream else OneCriticPassDreamerV3ActorLoss
    retnorm = {k: v.clone() for k, v in loss.retnorm.state_dict().items()}
    calls = CallCounter()
    # The slow critic runs on a copy of the critic's MLP (SyncFreeDreamerV3ValueLoss): count it too.
    slow_mlp = learner.value_loss._slow_value_model.module[0].module
    hooks = [mlp.register_forward_hook(lambda *_: calls.record("critic"))
             for mlp in (learner.models.modules["value"], slow_mlp)]
    try:
        torch.manual_seed(5)  # the policy's and the prior's samples
        actor = learner._actor_phase(latent)
        value = learner._value_phase(prepared, latent, actor.out)
    finally:
        for hook in hooks:
            hook.remove()
        loss.__class__ = OneCriticPassDreamerV3ActorLoss
        loss.retnorm.load_state_dict(retnorm)
    params = [p for n, p in learner.models.modules.named_parameters() if n.startswith(("actor.", "value."))]
    grads = torch.autograd.grad([learner._weighted(actor), learner._weighted(value)], params, allow_unused=True)
    metrics = [v.reshape(()) for part in (actor.losses, actor.metrics, value.losses, value.metrics)
               for v in part.values()]
    return torch.stack(metrics).detach(), actor.out.get("lambda_target"), grads, calls


@pytest.mark.parametrize("discrete", [False, True])
def test_one_critic_pass_gives_upstreams_reinforce_losses_and_gradients(discrete):
    """A REINFORCE update runs the critic once over the imagined states (upstream's
    losses: three times) with upstream's losses, returns and gradients, to rounding."""
    cfg, env, batch = _setup(name="CartPole-v1", action_repeat=1) if discrete else _setup()
    try:
        cfg.algo.actor_grad = "reinforce"
        learner = _learner(cfg, env)
    finally:
        close_env(env)
    assert learner.actor_loss.use_reinforce and learner.value_loss.slow_critic_regularization > 0
    with torch.no_grad():  # value, reward heads start at zero (outscale 0): make every term count
        for p in learner.models.modules.parameters():
            p.add_(0.1 * torch.randn_like(p))
        for p in learner.value_loss.target_value_model_params.values(True, True):
            p.add_(0.1 * torch.randn_like(p))  # a slow critic unlike the critic
    prepared = learner.prepare(batch.clone())
    latent = learner._world_model_phase(prepared).out.detach()
    theirs = _reinforce_actor_and_value(learner, prepared, latent, upstream=True)
    ours = _reinforce_actor_and_value(learner, prepared, latent, upstream=False)
    assert theirs[1].abs().min() > 0 and theirs[0].abs().min() > 0  # every loss term is non-zero
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-5, atol=1e-6)
    # Returns are symexp'd two-hot expectations, from critic passes over other batch shapes (another
    # summation order): their rounding is bounded in symlog space, where the heads work.
    torch.testing.assert_close(symlog(ours[1]), symlog(theirs[1]), rtol=1e-5, atol=1e-6)
    assert sum(g is not None and g.abs().sum() > 0 for g in theirs[2]) == len(theirs[2])
    for mine, upstream_grad in zip(ours[2], theirs[2]):
        torch.testing.assert_close(mine, upstream_grad, rtol=1e-4, atol=1e-5 * upstream_grad.abs().max().item())
    # Upstream: bootstraps, baseline, value loss, slow critic, replay (critic and slow).
    assert (theirs[3].total(), ours[3].total()) == (6, 4), (theirs[3].report(), ours[3].report())


@pytest.mark.slow
@pytest.mark.trace
@pytest.mark.timeout(600)
def test_v3_losses_path_traces_without_breaks_its_warm_up_touches_no_statistics_and_updates_trace_nothing(state_setup):
    """As shipped (compile.rssm_step on): the world-model loss traces the RSSM step's two graphs
    whatever the sequence length (the first step starts from zero latents that need no
    gradient, every later one from the previous step's); the warm-up traces every loss without
    a graph break, steps no optimiser and leaves the return statistics alone; updates after it
    trace nothing. (A discrete actor's trace: tests/algos/test_whole_update.py.)"""
    cfg, env, batch = state_setup
    cfg = copy.deepcopy(cfg)
    cfg.compile.enabled, cfg.compile.backend, cfg.compile.warmup_iters = True, "eager", 1
    assert cfg.compile.rssm_step
    learner = _learner(cfg, env)
    learner.compile()
    prepared = learner.prepare(batch.clone())
    assert prepared.shape[1] > 2
    assert _graphs_traced_by(lambda: learner.world_model_loss(prepared.clone())) == 2
    torch._dynamo.reset()
    counters.clear()
    assert not learner.models.model_based_env.__dict__.get("_cache")
    retnorm = {k: v.clone() for k, v in learner.actor_loss.retnorm.state_dict().items()}
    before = _parameters(learner)
    assert learner.warmup(batch.clone()) > 0
    torch.testing.assert_close(learner.actor_loss.retnorm.state_dict(), retnorm)
    after = _parameters(learner)
    assert all(torch.equal(before[n], after[n]) for n in before), "warm-up stepped an optimiser"
    traced = counters["stats"]["unique_graphs"]
    assert traced > 0 and not counters["graph_break"], dict(counters["graph_break"])
    with torch._dynamo.config.patch(error_on_recompile=True):
        learner.update(batch.clone())
        learner.update(batch.clone())
    assert counters["stats"]["unique_graphs"] == traced, "an update traced a compiled loss again"
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert all(math.isfinite(v) for v in learner.flush_metrics().values())


def _graphs_traced_by(fn) -> int:
    """Graphs dynamo traced while ``fn`` ran, from a fresh dynamo state."""
    torch._dynamo.reset()
    counters.clear()
    fn()
    return counters["stats"]["unique_graphs"]


@pytest.mark.slow
@pytest.mark.trace
@pytest.mark.timeout(600)
def test_v3_compile_without_the_rssm_step_leaves_the_world_model_eager_and_warm_up_covers_the_losses(state_setup):
    """compile.rssm_step=false: the world-model loss traces nothing; the warm-up traces the
    losses as the update runs them, and updates trace nothing after."""
    cfg, env, batch = state_setup
    cfg = copy.deepcopy(cfg)
    cfg.compile.enabled, cfg.compile.backend, cfg.compile.warmup_iters = True, "eager", 1
    cfg.compile.rssm_step = False
    learner = _learner(cfg, env)
    learner.compile()
    prepared = learner.prepare(batch.clone())
    assert _graphs_traced_by(lambda: learner.world_model_loss(prepared.clone())) == 0
    torch._dynamo.reset()
    counters.clear()
    learner.warmup(batch.clone())
    warmed = counters["stats"]["unique_graphs"]
    learner.update(batch.clone())
    learner.update(batch.clone())
    assert counters["stats"]["unique_graphs"] == warmed, "an update traced a loss again"
    assert all(math.isfinite(v) for v in learner.flush_metrics().values())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_v3_compiled_rssm_step_gives_the_eager_world_model_loss_and_gradients(state_setup):
    cfg, env, batch = state_setup
    results = []
    for rssm_step in (False, True):
        c = copy.deepcopy(cfg)
        c.compile.enabled, c.compile.backend, c.compile.rssm_step = True, "aot_eager", rssm_step
        learner = _learner(c, env)
        learner.compile()
        torch.manual_seed(3)  # the rollout draws its categorical samples
        wm_td, latent = learner.world_model_loss(learner.prepare(batch.clone()))
        loss = sum(wm_td[k].squeeze() for k in ("loss_model_dynamic", "loss_model_reco", "loss_model_reward"))
        loss.backward()
        grads = {n: p.grad.clone() for n, p in learner.models.modules.named_parameters() if p.grad is not None}
        results.append((loss.detach(), latent.get(("next", "state")), grads))
    (loss0, state0, grads0), (loss1, state1, grads1) = results
    torch.testing.assert_close(loss1, loss0)
    torch.testing.assert_close(state1, state0)
    assert grads1.keys() == grads0.keys() and any(k.startswith("prior.") for k in grads0)
    for name in grads0:
        torch.testing.assert_close(grads1[name], grads0[name], msg=name)


@pytest.mark.slow
@pytest.mark.trace
@pytest.mark.timeout(300)
def test_an_open_loop_report_runs_the_eager_rssm_step_and_traces_nothing(pixel_setup):
    """The report runs the world model on a few sequences under no_grad: the compiled
    step (warmed on the update's shape, with gradients) would compile a new graph."""
    from dreamer.report.openloop import openloop_video

    cfg, env, batch = pixel_setup
    cfg = copy.deepcopy(cfg)
    cfg.compile.enabled, cfg.compile.backend, cfg.compile.warmup_iters = True, "eager", 1
    learner = _learner(cfg, env)
    learner.compile()
    learner.warmup(batch.clone())
    prepared = learner.prepare(batch.clone())
    counters.clear()
    video = openloop_video(learner.models, prepared, context=2, sequences=1)
    assert video.dtype == torch.uint8 and video.shape[0] == cfg.buffer.batch_length
    assert counters["stats"]["unique_graphs"] == 0
    traced = _graphs_traced_by(lambda: learner.world_model_loss(prepared[:1].clone()))
    assert traced == 2, "outside the report the world model runs the compiled step"


def _optimizer_state(learner, name: str) -> list[torch.Tensor]:
    opt = learner.optimizers[name]
    return [v.clone() for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]


def test_v3_non_finite_update_is_undone_counted_and_recovers(state_setup):
    cfg, env, batch = state_setup
    learner = _learner(cfg, env)
    learner.update(batch.clone())  # one good update: optimiser state exists
    learner.flush_metrics()
    wm_parts = ("encoder", "decoder", "prior", "posterior", "reward", "continuation")
    weights = {k: v.clone() for k, v in learner.models.modules.state_dict().items() if k.split(".")[0] in wm_parts}
    moments = _optimizer_state(learner, "world_model")
    poisoned = batch.clone()
    poisoned["next", "reward"][0, 0] = float("nan")  # NaN reward -> NaN world-model gradients (two-hot clamps inf)
    for _ in range(2):
        learner.update(poisoned.clone())
    after = learner.models.modules.state_dict()
    assert all(torch.equal(after[k], v) for k, v in weights.items())
    for now, then in zip(_optimizer_state(learner, "world_model"), moments):
        assert torch.equal(now, then)
    metrics = learner.flush_metrics()
    assert metrics["updates_skipped_nonfinite"] == 2 and metrics["nonfinite_streak"] == 2

    learner.update(batch.clone())  # a good update steps again, with finite weights
    after = learner.models.modules.state_dict()
    assert not all(torch.equal(after[k], v) for k, v in weights.items())
    assert all(torch.isfinite(after[k]).all() for k in weights)

"""dreamer/algos/nonfinite.py: each algorithm's non-finite policy, through the
shared learner skeleton, leaves weights and optimiser state bit-identical."""

from __future__ import annotations

import io

import pytest
import torch
from torchrl.trainers.algorithms import DreamerV3Optimizer

from dreamer.algos.learner import PHASES, PhaseOut
from dreamer.algos.nonfinite import SkipInStep
from dreamer.algos.registry import ALGORITHMS
from dreamer.config import validate
from tests.support.configs import tiny_config
from tests.support.gpu_checks import NAN_REWARD, NAN_REWARD_CUDA
from tests.support.learners import learner_on
from torchrl_ext.optim import SkippableDreamerV3Optimizer

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

CPU = torch.device("cpu")


def _config(algo: str):
    cfg = tiny_config(algo=algo)
    if algo == "dreamer_v3":
        a = cfg.algo
        a.num_categoricals, a.num_classes, a.num_bins, a.mlp_layers = 4, 4, 31, 1
    return validate(cfg)


@pytest.fixture(scope="module", params=list(ALGORITHMS))
def setup(request):
    """A tiny learner of one algorithm and a batch its policy collected."""
    return learner_on(_config(request.param), CPU)


def _weights_and_optimizers(learner) -> bytes:
    """Every weight and every optimiser's state (moments and step counts, which
    drive lr warm-up and bias correction), as a checkpoint writes them."""
    state = learner.state_dict()
    buffer = io.BytesIO()
    torch.save({"modules": state["modules"], "optimizers": state["optimizers"]}, buffer)
    return buffer.getvalue()


def _poison(hook):
    """A phase hook whose loss is NaN (NaN gradients for every parameter it reaches)."""
    def poisoned(*args):
        out = hook(*args)
        return PhaseOut({name: loss * float("nan") for name, loss in out.losses.items()}, out.metrics, out.out)
    return poisoned


def test_a_nan_loss_in_every_phase_leaves_weights_and_optimiser_state_bit_identical(setup, monkeypatch):
    learner, batch = setup
    learner.update(batch.clone())  # one good update: optimiser state exists
    learner.flush_metrics()
    before = _weights_and_optimizers(learner)
    for name in PHASES:
        hook = getattr(learner, f"_{name}_phase")
        monkeypatch.setattr(learner, f"_{name}_phase", _poison(hook))
    learner.update(batch.clone())
    monkeypatch.undo()
    assert _weights_and_optimizers(learner) == before
    metrics = learner.flush_metrics()
    assert metrics["updates_skipped_nonfinite"] == 1 and metrics["nonfinite_streak"] == 1

    learner.update(batch.clone())  # a finite update steps again
    assert _weights_and_optimizers(learner) != before
    assert learner.flush_metrics()["updates_skipped_nonfinite"] == 0


def _nan_step(policy, optimizer, param, found_inf: float):
    param.grad = torch.full_like(param, float("nan") if found_inf else 1.0)
    policy.step(optimizer, [param], torch.tensor(found_inf))


@pytest.mark.parametrize("policy, make_optimizer", [
    (SkipInStep(), lambda p: torch.optim.Adam([p], lr=0.1, fused=True)),
    (SkipInStep(), lambda p: SkippableDreamerV3Optimizer([p], lr=0.1, agc=0.3, eps=1e-20, warmup_steps=0)),
], ids=["v1_fused_adam", "v3_laprop_agc"])
def test_each_policy_skips_a_flagged_step_and_takes_a_clean_one(policy, make_optimizer):
    param = torch.nn.Parameter(torch.ones(3))
    optimizer = make_optimizer(param)
    _nan_step(policy, optimizer, param, found_inf=1.0)  # a skipped first step: nothing moves
    assert torch.equal(param.detach(), torch.ones(3))
    _nan_step(policy, optimizer, param, found_inf=0.0)
    moved = param.detach().clone()
    assert not torch.equal(moved, torch.ones(3)) and torch.isfinite(moved).all()
    state = [v.clone() for v in optimizer.state[param].values() if torch.is_tensor(v)]
    _nan_step(policy, optimizer, param, found_inf=1.0)
    assert torch.equal(param.detach(), moved)
    assert all(torch.equal(now, then) for now, then in zip(
        [v for v in optimizer.state[param].values() if torch.is_tensor(v)], state))


@pytest.mark.parametrize("make_optimizer", [
    lambda p: torch.optim.Adam([p], lr=0.1, foreach=True),
    lambda p: DreamerV3Optimizer([p], lr=0.1),  # upstream's: no found_inf input
], ids=["foreach_adam", "upstream_laprop"])
def test_skip_in_step_refuses_an_optimiser_that_would_ignore_found_inf(make_optimizer):
    param = torch.nn.Parameter(torch.ones(3))
    with pytest.raises(TypeError, match="found_inf"):
        _nan_step(SkipInStep(), make_optimizer(param), param, found_inf=1.0)

@pytest.mark.parametrize("device", [pytest.param("cpu", marks=pytest.mark.gpu_acceptance(NAN_REWARD)),
                                    pytest.param("cuda", marks=pytest.mark.cuda(NAN_REWARD_CUDA))])
@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_a_nan_reward_skips_the_world_model_step_counts_it_and_leaves_its_weights(algo, device):
    """A NaN reward in a sampled batch, on the learner's device: the world-model step
    is skipped (its weights and optimiser state bit-identical), counted, and the
    next clean batch steps again."""
    cfg = _config(algo)
    learner, batch = learner_on(cfg, torch.device(device))
    learner.update(batch.clone())  # one good update: optimiser state exists
    learner.flush_metrics()
    optimizer = learner.optimizers["world_model"]

    def world_model_state() -> list[torch.Tensor]:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        moments = [v for p in params for v in optimizer.state[p].values() if isinstance(v, torch.Tensor)]
        return [t.detach().clone() for t in params + moments]

    before = world_model_state()
    poisoned = batch.clone()
    poisoned["next", "reward"][0, 0] = float("nan")
    for _ in range(2):
        learner.update(poisoned.clone())
    assert all(torch.equal(a, b) for a, b in zip(world_model_state(), before))
    assert learner.flush_metrics()["updates_skipped_nonfinite"] == 2
    learner.update(batch.clone())
    assert not all(torch.equal(a, b) for a, b in zip(world_model_state(), before))


def _running_averages(learner) -> list[torch.Tensor]:
    """The slow critic's weights (V3; V1 with slow_value_tau) and the return percentiles (V3)."""
    if hasattr(learner, "slow_critic"):  # V3
        slow = list(learner.value_loss.target_value_model_params.values(True, True))
        percentiles = learner._statistics()  # what a checkpoint saves of the return norm, every entry
        assert len(percentiles) == len(learner.actor_loss.retnorm.state_dict()) > 0
        return [t.detach().clone() for t in slow + percentiles]
    return [p.detach().clone() for p in learner.slow_value.parameters()]


@pytest.mark.gpu_acceptance(NAN_REWARD)
@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_a_skipped_update_moves_no_running_average(algo):
    """A non-finite update is skipped whole: the slow critic stays where it was (it would
    otherwise step toward the critic), and so do V3's return percentiles (a NaN return
    would otherwise enter them); the next finite update moves both again."""
    cfg = _config(algo)
    if algo == "dreamer_v1":
        cfg.algo.slow_value_tau = 0.02
    learner, batch = learner_on(cfg, CPU)
    for _ in range(2):  # the slow critic now trails the critic; the percentiles have moved
        learner.update(batch.clone())
    before = _running_averages(learner)
    poisoned = batch.clone()
    poisoned["next", "reward"][0, 0] = float("nan")
    learner.update(poisoned)
    assert all(torch.equal(a, b) for a, b in zip(_running_averages(learner), before))
    assert learner.flush_metrics()["updates_skipped_nonfinite"] == 1
    learner.update(batch.clone())
    assert not all(torch.equal(a, b) for a, b in zip(_running_averages(learner), before))

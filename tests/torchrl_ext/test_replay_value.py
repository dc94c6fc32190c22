"""torchrl_ext/dreamer_v3.py: the sync-free replay-value loss gives upstream's
numbers and gradients, reads nothing on the host, and respects episode ends."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torchrl.modules import DreamerV3MLP, SymExpTwoHot
from torchrl.objectives import DreamerV3ValueLoss, SoftUpdate

from tests.support.spies import CallCounter, spy_tensor_methods
from torchrl_ext import SyncFreeDreamerV3ValueLoss, replay_lambda_returns

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

B, T, S, H, BINS = 3, 7, 6, 5, 31


def _value_model(seed: int) -> TensorDictSequential:
    torch.manual_seed(seed)
    mlp = DreamerV3MLP(S + H, BINS, depth=1, num_cells=8)
    torch.nn.init.normal_(mlp.model[-1].weight, std=0.5)  # a non-trivial value head
    return TensorDictSequential(
        TensorDictModule(mlp, in_keys=["state", "belief"], out_keys=["state_value_logits"]),
        TensorDictModule(SymExpTwoHot(BINS), in_keys=["state_value_logits"], out_keys=["state_value"]),
    )


def _replay(done_at: int | None = None) -> TensorDict:
    g = torch.Generator().manual_seed(1)
    done = torch.zeros(B, T, 1, dtype=torch.bool)
    if done_at is not None:
        done[0, done_at] = True
    return TensorDict(
        {
            "state": torch.randn(B, T, S, generator=g),
            "belief": torch.randn(B, T, H, generator=g),
            "bootstrap": torch.randn(B, T, generator=g) * 10,
            "next": {"reward": torch.randn(B, T, 1, generator=g), "done": done, "terminated": done.clone()},
        },
        [B, T],
    )


def _loss(cls, slow_reg: float):
    model = _value_model(0)
    # The same weights on both sides whatever else drew from the global RNG meanwhile.
    model.load_state_dict(_SAME_WEIGHTS)
    loss = cls(model, value_loss="two_hot", num_value_bins=BINS, slow_critic_regularization=slow_reg)
    if slow_reg:
        SoftUpdate(loss, tau=0.02)  # as a trainer pairs them: the slow critic has its updater
    return loss


_SAME_WEIGHTS = _value_model(0).state_dict()


@pytest.mark.parametrize("slow_reg", [0.0, 1.0])
@pytest.mark.parametrize("done_at", [None, 3])
def test_sync_free_replay_value_loss_matches_upstream(slow_reg, done_at):
    ours, upstream = _loss(SyncFreeDreamerV3ValueLoss, slow_reg), _loss(DreamerV3ValueLoss, slow_reg)
    replay = _replay(done_at)
    mine = ours.replay_value_loss(replay.clone(), horizon=50.0, lmbda=0.9)["loss_replay_value"]
    theirs = upstream.replay_value_loss(replay.clone(), horizon=50.0, lmbda=0.9)["loss_replay_value"]
    torch.testing.assert_close(mine, theirs)
    mine.backward()
    theirs.backward()
    for a, b in zip(ours.value_model_params.values(True, True), upstream.value_model_params.values(True, True)):
        torch.testing.assert_close(a.grad, b.grad)


def test_replay_value_loss_reads_nothing_on_the_host(monkeypatch):
    loss = _loss(SyncFreeDreamerV3ValueLoss, 1.0)
    replay = _replay(done_at=3)
    counter = CallCounter()
    spy_tensor_methods(monkeypatch, ("item", "cpu", "tolist", "__bool__", "__float__", "__int__"), counter)
    loss.replay_value_loss(replay, horizon=50.0, lmbda=0.9)["loss_replay_value"].backward()
    assert counter.total() == 0, counter.report()


def test_replay_returns_stop_at_episode_ends():
    """A return never reaches across a done: rewards after it do not count."""
    reward = torch.zeros(1, 6, 1)
    reward[0, 4] = 100.0  # received on entering step 4
    done = torch.zeros(1, 6, 1, dtype=torch.bool)
    bootstrap = torch.zeros(1, 6)
    open_returns = replay_lambda_returns(reward, done, done, bootstrap, horizon=100.0, lmbda=0.95)
    done[0, 2] = True  # the episode ends on entering step 2
    cut_returns = replay_lambda_returns(reward, done, done, bootstrap, horizon=100.0, lmbda=0.95)
    assert open_returns.shape == (1, 5)
    assert open_returns[0, 0] > 0 and cut_returns[0, 0] == 0  # state 0's return ends at step 2
    assert cut_returns[0, 3] == 100.0  # state 3 receives the reward of step 4 directly

"""Shared by the update-path tests (tests/algos/test_whole_update.py, test_captured_update.py):
tiny V3 configs, learners from one seed, and state comparisons."""

from __future__ import annotations

import torch

from dreamer.algos.update_paths import tensor_leaves
from dreamer.algos.v3.learner import DreamerV3Learner
from dreamer.algos.v3.models import build_models
from dreamer.config import validate
from dreamer.data.replay import stored_keys
from dreamer.envs.keys import observation_key
from tests.support.configs import tiny_config

CPU = torch.device("cpu")


def v3_config(*, discrete: bool = False, pixels: bool = False, update: str = "losses", compiled: bool = False):
    """The tiny V3 config (batch 2 x 5, horizon 3); ``compiled``: torch.compile with
    the eager backend (dynamo's graphs, eager kernels: the eager path's random draws)."""
    env = {"name": "CartPole-v1", "action_repeat": 1} if discrete else {}
    cfg = tiny_config(pixels=pixels, algo="dreamer_v3", **env)
    a = cfg.algo
    a.num_categoricals, a.num_classes, a.num_bins, a.mlp_layers = 4, 4, 31, 1
    a.lr_warmup_steps = 0  # every update moves every weight
    c = cfg.compile
    c.enabled, c.backend, c.update, c.warmup_iters = compiled, "eager", update, 1
    return validate(cfg)


def collected_batch(cfg, env, device: torch.device = CPU):
    """batch_size * batch_length steps the acting policy (on the CPU, as collectors run it)
    collected, reduced to what the replay stores, on ``device``."""
    torch.manual_seed(0)
    policy = build_models(cfg.algo, cfg.env, env, CPU).policy(explore=True)
    with torch.no_grad():
        rollout = env.rollout(cfg.buffer.batch_size * cfg.buffer.batch_length, policy, break_when_any_done=False)
    return rollout.select(*stored_keys(observation_key(cfg.env)), strict=False).to(device)


def v3_learner(cfg, env, device: torch.device = CPU) -> DreamerV3Learner:
    torch.manual_seed(1)  # the same initial weights for every learner of a test
    models = build_models(cfg.algo, cfg.env, env, device)
    return DreamerV3Learner(
        cfg.algo, cfg.compile, models, device, batch_size=cfg.buffer.batch_size, batch_length=cfg.buffer.batch_length
    )


def assert_same_state(ours: DreamerV3Learner, reference: DreamerV3Learner) -> None:
    """Weights, optimiser moments and step counts, return statistics, slow critic: equal to rounding."""
    mine, theirs = tensor_leaves(ours.state_dict()), tensor_leaves(reference.state_dict())
    assert len(mine) == len(theirs) > 0
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def assert_same_state_dicts(ours: dict, reference: dict) -> None:
    for a, b in zip(tensor_leaves(ours), tensor_leaves(reference), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)

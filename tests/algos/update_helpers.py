"""Shared by the update-path tests (tests/algos/test_whole_update.py, test_captured_update.py):
tiny V3 configs, learners from one seed, and state comparisons."""

from __future__ import annotations

import torch

from dreamer.algos.update_paths import tensor_leaves
from dreamer.algos.v3.learner import DreamerV3Learner
from dreamer.config import validate
from tests.support.configs import tiny_config
from tests.support.learners import collected_steps, new_learner

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
    return collected_steps(cfg, env, device=device)


def v3_learner(cfg, env, device: torch.device = CPU) -> DreamerV3Learner:
    return new_learner(cfg, env, seed=1, device=device)  # the same initial weights for every learner of a test


def assert_same_state(ours: DreamerV3Learner, reference: DreamerV3Learner) -> None:
    """Weights, optimiser moments and step counts, return statistics, slow critic: equal to rounding."""
    mine, theirs = tensor_leaves(ours.state_dict()), tensor_leaves(reference.state_dict())
    assert len(mine) == len(theirs) > 0
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def assert_same_state_dicts(ours: dict, reference: dict) -> None:
    for a, b in zip(tensor_leaves(ours), tensor_leaves(reference), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)

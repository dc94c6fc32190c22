"""Learners and batches of stored steps, built the way a run builds them: the one helper every
learner test module uses (the algorithm from the registry, the acting policy rolled out on the
CPU as collectors do, the records the replay would hold)."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from dreamer.config import Config

CPU = torch.device("cpu")


def collected_steps(cfg: Config, env, seed: int = 0, device: torch.device = CPU) -> TensorDict:
    """batch_size * batch_length steps the acting policy (fresh networks from ``seed``, on the
    CPU) collected in ``env``, reduced to what the replay stores, on ``device``."""
    from dreamer.algos.registry import algorithm
    from dreamer.data.replay import stored_keys

    build, _ = algorithm(cfg.algo.name)
    torch.manual_seed(seed)
    acting = build(cfg.algo, cfg.env, env, CPU)
    with torch.no_grad():
        rollout = env.rollout(cfg.buffer.batch_size * cfg.buffer.batch_length, acting.policy(explore=True),
                              break_when_any_done=False)
    return rollout.select(*stored_keys(acting.obs_key), strict=False).to(device)


def new_learner(cfg: Config, env, *, seed: int = 0, device: torch.device = CPU,
                autocast_dtype: torch.dtype | None = None):
    """The algorithm's learner (``cfg.compile``'s update path, not compiled yet) on fresh
    networks from ``seed``, on ``device``."""
    from dreamer.algos.registry import algorithm

    build, learner_cls = algorithm(cfg.algo.name)
    torch.manual_seed(seed)
    models = build(cfg.algo, cfg.env, env, device)
    return learner_cls(cfg.algo, cfg.compile, models, device, batch_size=cfg.buffer.batch_size,
                       batch_length=cfg.buffer.batch_length, autocast_dtype=autocast_dtype)


def learner_on(cfg: Config, device: torch.device, autocast_dtype: torch.dtype | None = None):
    """(learner on ``device``, one batch of stored steps on ``device``), both from seed 0, in an
    env built and closed here."""
    from dreamer.envs.factory import close_env, make_env

    env = make_env(cfg.env, cfg.algo, seed=0)
    try:
        batch = collected_steps(cfg, env, device=device)
        learner = new_learner(cfg, env, device=device, autocast_dtype=autocast_dtype)
    finally:
        close_env(env)
    return learner, batch

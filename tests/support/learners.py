"""A learner and one batch of its stored steps, built the way a run builds them."""

from __future__ import annotations

import torch

from dreamer.config import Config
from dreamer.envs.factory import close_env


def learner_on(cfg: Config, device: torch.device, autocast_dtype: torch.dtype | None = None):
    """(learner on ``device``, one batch of stored steps on ``device``): the acting
    policy is built and rolled out on the CPU (as collectors do), the learner's
    networks on ``device``, both from seed 0."""
    from dreamer.algos.registry import algorithm
    from dreamer.data.replay import stored_keys
    from dreamer.envs.factory import make_env

    build, learner_cls = algorithm(cfg.algo.name)
    env = make_env(cfg.env, cfg.algo, seed=0)
    try:
        torch.manual_seed(0)
        acting = build(cfg.algo, cfg.env, env, torch.device("cpu"))
        with torch.no_grad():
            rollout = env.rollout(cfg.buffer.batch_size * cfg.buffer.batch_length, acting.policy(explore=True),
                                  break_when_any_done=False)
        models = build(cfg.algo, cfg.env, env, device)
    finally:
        close_env(env)
    batch = rollout.select(*stored_keys(models.obs_key), strict=False).to(device)
    learner = learner_cls(cfg.algo, cfg.compile, models, device, batch_size=cfg.buffer.batch_size,
                          batch_length=cfg.buffer.batch_length, autocast_dtype=autocast_dtype)
    return learner, batch

"""Configs small enough for a CPU unit test, and an old checkpoint layout."""

from __future__ import annotations

import dataclasses

from dreamer.config import AlgoConfig, Config, DreamerV1Config, DreamerV3Config, validate


def tiny_config(*, pixels: bool = False, algo: str = "dreamer_v1", **env_overrides) -> Config:
    """A validated Config small enough for a CPU unit test (no torch.compile).

    ``algo="dreamer_v3"``: V3 with V1's learning rates, adam_eps and gamma and
    the paper's 32 x 32 latent and warm-up, the values its tests have always run
    with (the algo classes were one class then).
    """
    cfg = Config()
    v1 = DreamerV1Config()
    if algo == "dreamer_v1":
        cfg.algo = v1
    else:
        shared = {f.name: getattr(v1, f.name) for f in dataclasses.fields(AlgoConfig) if f.name != "name"}
        cfg.algo = DreamerV3Config(**shared, num_categoricals=32, num_classes=32, lr_warmup_steps=1000)
    cfg.env.from_pixels = pixels
    cfg.env.max_episode_steps = 50
    for key, value in env_overrides.items():
        setattr(cfg.env, key, value)
    a = cfg.algo
    if algo == "dreamer_v1":
        a.state_dim = 4
    a.rssm_hidden_dim, a.hidden_dim, a.encoder_channels = 8, 16, 4
    a.imagination_horizon = 3
    b = cfg.buffer
    b.capacity, b.batch_size, b.batch_length, b.prefetch = 200, 2, 5, 0
    cfg.compile.enabled = False
    cfg.collector.num_workers = 0
    cfg.collector.init_random_frames = 100  # what a 200-step replay can hold
    return validate(cfg)

"""Configs small enough for a CPU unit test, and an old checkpoint layout."""

from __future__ import annotations

import dataclasses
import json

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


def old_layout_config(new: dict, channels_last: bool) -> dict:
    """``new`` as the merged AlgoConfig wrote it: channels_last at the top, and
    every key of both algorithms in algo (the other algorithm's at their defaults)."""
    old = json.loads(json.dumps(new))
    v1_only = {"state_dim": 30, "activation": "elu", "grad_clip": 100.0, "kl_scale": 1.0,
               "free_nats": 3.0, "exploration_noise": 0.3}
    v3_only = {"num_categoricals": 32, "num_classes": 32, "unimix": 0.01, "free_bits": 1.0,
               "dyn_loss_scale": 0.5, "rep_loss_scale": 0.1, "num_bins": 255, "gru_blocks": 8,
               "mlp_layers": 2, "entropy_scale": 3.0e-4, "return_norm_rate": 0.01,
               "return_norm_min_scale": 1.0, "slow_critic_tau": 0.02, "slow_critic_reg": 1.0,
               "agc": 0.3, "lr_warmup_steps": 1000, "actor_grad": "auto", "replay_value_scale": 0.3}
    old["algo"].pop("channels_last", None)
    old["algo"] = {**v1_only, **v3_only, **old["algo"]}
    old["channels_last"] = channels_last
    return old

"""Where an env's observation lives in its tensordict: the key every module reads."""

from __future__ import annotations

from dreamer.config import EnvConfig

PIXELS_KEY = "pixels"
VECTOR_KEY = "observation"


def observation_key(env_cfg: EnvConfig) -> str:
    return PIXELS_KEY if env_cfg.from_pixels or env_cfg.backend == "atari" else VECTOR_KEY

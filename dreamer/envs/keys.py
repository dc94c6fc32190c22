"""Where an env's observation lives in its tensordict, and the episode-start flag: keys every module reads."""

from __future__ import annotations

from dreamer.config import EnvConfig

PIXELS_KEY = "pixels"
VECTOR_KEY = "observation"
# Replay records: True where the record is an episode's first observation (the reset's).
IS_FIRST = "is_first"


def observation_key(env_cfg: EnvConfig) -> str:
    return PIXELS_KEY if env_cfg.from_pixels or env_cfg.backend == "atari" else VECTOR_KEY

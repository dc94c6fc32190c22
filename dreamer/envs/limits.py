"""Episode lengths known before an env is built: the replay's sequences must fit in them.

The replay cuts ``buffer.batch_length``-step sequences inside single episodes; an env
whose episodes all end sooner would fail at the first sample ("Did not find a single
trajectory with sufficient length"). Where the episode limit is registered (gymnasium's
``max_episode_steps``) that is one line before the run starts. Imports no torch/torchrl.
"""

from __future__ import annotations

import importlib
import math

from dreamer.config import EnvConfig
from dreamer.errors import UserError


def registered_episode_limit(env_cfg: EnvConfig) -> int | None:
    """The most agent steps a gymnasium episode lasts by its registered time limit (raw env
    steps, ``env.action_repeat`` to an agent step); None where no limit is registered, for
    other backends (dm_control's suite limits its episodes to 1000 control steps, Atari's vary),
    and where the id or its module is unknown (the env factory says so in one line)."""
    if env_cfg.backend != "gymnasium":
        return None
    import gymnasium

    if env_cfg.import_:
        try:
            importlib.import_module(env_cfg.import_)
        except ImportError:
            return None
    try:
        limit = gymnasium.spec(env_cfg.name).max_episode_steps
    except gymnasium.error.Error:
        return None
    return None if limit is None else math.ceil(limit / env_cfg.action_repeat)


def check_sequences_fit_episodes(env_cfg: EnvConfig, batch_length: int) -> None:
    """One line when every episode ends before a ``batch_length``-step sequence fits in it."""
    limit = registered_episode_limit(env_cfg)
    if limit is not None and limit < batch_length:
        raise UserError(
            f"env.name={env_cfg.name} ends its episodes after at most {limit} agent steps (its registered "
            f"time limit at env.action_repeat={env_cfg.action_repeat}), fewer than buffer.batch_length="
            f"{batch_length}: set buffer.batch_length<={limit}"
        )

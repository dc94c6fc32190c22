"""A user's own gymnasium env, as a module that registers it (for ``env.import``)."""

from __future__ import annotations

from pathlib import Path

# Each construction appends its process id to $CUSTOM_ENV_BUILT_BY, if set, so
# a test can see which processes built one.
CUSTOM_ENV_MODULE = """
import os

import gymnasium
import numpy as np


class DriftEnv(gymnasium.Env):
    \"\"\"A point on a line: the action pushes it, reward is minus its distance to 0.\"\"\"

    observation_space = gymnasium.spaces.Box(-10.0, 10.0, (2,), np.float32)
    action_space = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self):
        if os.environ.get("CUSTOM_ENV_BUILT_BY"):
            with open(os.environ["CUSTOM_ENV_BUILT_BY"], "a") as f:
                f.write(f"{os.getpid()}\\n")

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = float(self.np_random.uniform(-1.0, 1.0))
        return np.array([self.x, 0.0], np.float32), {}

    def step(self, action):
        self.x = float(np.clip(self.x + 0.1 * float(action[0]), -10.0, 10.0))
        return np.array([self.x, 1.0], np.float32), -abs(self.x), False, False, {}


gymnasium.register(id="{env_id}", entry_point=__name__ + ":DriftEnv", max_episode_steps=60)
"""


def write_custom_env_module(directory: Path, module: str, env_id: str) -> Path:
    """``directory/module.py`` registering ``env_id`` with gymnasium when imported."""
    path = Path(directory) / f"{module}.py"
    path.write_text(CUSTOM_ENV_MODULE.replace("{env_id}", env_id))
    return path

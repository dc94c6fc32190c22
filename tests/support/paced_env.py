"""Pendulum at a wall-clock pace, for ``env.import=tests.support.paced_env``.

Some e2e tests wait for something that takes wall-clock time (a compile child, a
time budget) while the run trains beside it. On Pendulum the run would spend
that wait at full speed on both cores; PacedPendulum sleeps in every step, so
the run collects at about ``1 / STEP_S`` env steps per second and, at a low
train ratio, leaves the cores to the work the test is about.
"""

from __future__ import annotations

import time

import gymnasium
from gymnasium.envs.classic_control.pendulum import PendulumEnv

ENV_ID = "PacedPendulum-v1"
STEP_S = 0.02
# env=pendulum's state vector and action repeat, collected at the pace above.
OVERRIDES = ("env=pendulum", f"env.name={ENV_ID}", f"env.import={__name__}")


class PacedPendulum(PendulumEnv):
    def step(self, action):
        time.sleep(STEP_S)  # releases the GIL: the learner's threads run meanwhile
        return super().step(action)


if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point=f"{__name__}:PacedPendulum", max_episode_steps=200)

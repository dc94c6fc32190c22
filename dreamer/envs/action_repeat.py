"""Action repeat that renders one frame per agent step.

TorchRL's ``frame_skip`` steps its wrapped env k times, and a pixel env renders
on every one of those steps (dm_control's ``pixels.Wrapper``, gymnasium's
``AddRenderObservation``) before the last frame is kept: k - 1 of every k
renders are thrown away, and rendering is most of a pixel env step (software
MuJoCo rendering costs many times a physics step). These
wrappers repeat the action *below* the pixel wrapper, so the frame is drawn
once, after the last repeat. Observation, summed reward and the end of the
episode (a repeat stops at the first terminal or truncated step) are what
``frame_skip`` gives.
"""

from __future__ import annotations

import dm_env
import gymnasium


class DMControlActionRepeat(dm_env.Environment):
    """A dm_control env stepped ``repeat`` times per ``step``; attributes (physics, task) pass through."""

    def __init__(self, env: dm_env.Environment, repeat: int):
        self._env = env
        self._repeat = repeat

    def reset(self) -> dm_env.TimeStep:
        return self._env.reset()

    def step(self, action) -> dm_env.TimeStep:
        reward = 0.0
        for _ in range(self._repeat):
            timestep = self._env.step(action)
            reward += timestep.reward or 0.0
            if timestep.last():
                break
        return timestep._replace(reward=reward)

    def observation_spec(self):
        return self._env.observation_spec()

    def action_spec(self):
        return self._env.action_spec()

    def reward_spec(self):
        return self._env.reward_spec()

    def discount_spec(self):
        return self._env.discount_spec()

    def close(self) -> None:
        self._env.close()

    def __getattr__(self, name: str):
        return getattr(self._env, name)


class GymActionRepeat(gymnasium.Wrapper):
    """A gymnasium env stepped ``repeat`` times per ``step``, rewards summed; render() draws the last state."""

    def __init__(self, env: gymnasium.Env, repeat: int):
        super().__init__(env)
        self.repeat = repeat

    def step(self, action):
        total = 0.0
        for _ in range(self.repeat):
            observation, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if terminated or truncated:
                break
        return observation, total, terminated, truncated, info

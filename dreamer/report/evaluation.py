"""Evaluation: deterministic episodes on a separate env, returns and optional video."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torchrl.envs import EnvBase
from torchrl.envs.utils import ExplorationType, set_exploration_type

from dreamer.envs.keys import PIXELS_KEY


@dataclass
class EvalResult:
    returns: list[float]
    frames: torch.Tensor | None = field(default=None, repr=False)  # (T, H, W, C) uint8

    @property
    def mean(self) -> float:
        return float(torch.tensor(self.returns).mean())

    @property
    def std(self) -> float:
        return float(torch.tensor(self.returns).std(unbiased=False))


@torch.no_grad()
def evaluate(env: EnvBase, policy, *, episodes: int, max_steps: int, record: bool) -> EvalResult:
    """Run ``episodes`` episodes with the policy's mode (no exploration noise).

    With ``record``, the first episode's frames are returned for a video.
    """
    returns, frames = [], None
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        for episode in range(episodes):
            rollout = env.rollout(
                max_steps, policy, auto_cast_to_device=True, break_when_any_done=True
            )
            returns.append(float(rollout["next", "episode_reward"][-1]))
            if record and episode == 0 and PIXELS_KEY in rollout.keys():
                frames = rollout[PIXELS_KEY].cpu()
    return EvalResult(returns=returns, frames=frames)

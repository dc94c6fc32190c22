"""The train ratio's arithmetic, in one place.

``train.train_ratio`` is replayed steps per agent step; an update replays
``buffer.batch_size x buffer.batch_length`` steps. Everything derived from the
two (updates per agent step, agent steps and env frames per update, the ratio a
run achieved, what the first update needs) is read from :class:`TrainRatio`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dreamer.config.schema import Config


@dataclass(frozen=True)
class TrainRatio:
    train_ratio: float  # replayed steps per agent step
    batch_size: int  # sequences per update
    batch_length: int  # steps per sequence

    @classmethod
    def of(cls, cfg: Config) -> TrainRatio:
        """From a :class:`~dreamer.config.Config` (its train and buffer sections)."""
        return cls(cfg.train.train_ratio, cfg.buffer.batch_size, cfg.buffer.batch_length)

    @property
    def replayed_per_update(self) -> int:
        """Steps one update replays: one sample of the replay buffer."""
        return self.batch_size * self.batch_length

    @property
    def updates_per_step(self) -> float:
        return self.train_ratio / self.replayed_per_update

    @property
    def steps_per_update(self) -> float:
        return self.replayed_per_update / self.train_ratio

    def frames_per_update(self, action_repeat: int) -> float:
        return action_repeat * self.steps_per_update

    def achieved(self, updates: int, steps: int) -> float:
        """Replayed steps per agent step so far (the train ratio as delivered)."""
        return updates * self.replayed_per_update / max(steps, 1)

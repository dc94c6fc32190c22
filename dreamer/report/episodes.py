"""Returns of the episodes the collector finished: the training-side learning curve.

Every env keeps its running return under ``("next", "episode_reward")`` (TorchRL's
``RewardSum``, dreamer/envs/factory.py) and its agent step under ``step_count``, so a
collector batch already says, at each step where an episode ended, what that
episode returned and how long it was: nothing is carried across batches. The
batches live on the host (the collector's storing device), so reading them here
costs no device sync.

These episodes are played with the exploring policy (random actions before
learning starts), where evaluation plays the deterministic one: the two curves
differ, and a gap between them is itself worth seeing.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

RETURN_KEY = ("next", "episode_reward")
DONE_KEY = ("next", "done")
LENGTH_KEY = ("next", "step_count")


class CollectedEpisodes:
    """Accumulates finished episodes between two log records."""

    def __init__(self) -> None:
        self.returns: list[float] = []
        self.lengths: list[int] = []

    def add(self, batch: TensorDictBase) -> int:
        """The episodes that ended in ``batch`` (any leading shape); returns how many."""
        # One lookup per key (not a walk of the batch's nested keys per test).
        returns, done = batch.get(RETURN_KEY, None), batch.get(DONE_KEY, None)
        if returns is None or done is None:
            return 0
        done = done.reshape(-1)
        if not done.any():
            return 0
        self.returns.extend(returns.reshape(-1)[done].tolist())
        lengths = batch.get(LENGTH_KEY, None)
        if lengths is not None:
            self.lengths.extend(lengths.reshape(-1)[done].tolist())
        return int(done.sum())

    def flush(self) -> dict[str, float]:
        """The interval's ``train_return_mean`` / ``_min`` / ``_max``, ``train_episodes`` and
        ``train_episode_length`` (agent steps); {} when no episode ended in it."""
        if not self.returns:
            return {}
        returns = torch.tensor(self.returns, dtype=torch.float64)
        record = {"train_return_mean": returns.mean().item(), "train_return_min": returns.min().item(),
                  "train_return_max": returns.max().item(), "train_episodes": len(self.returns)}
        if self.lengths:
            record["train_episode_length"] = sum(self.lengths) / len(self.lengths)
        self.returns, self.lengths = [], []
        return record

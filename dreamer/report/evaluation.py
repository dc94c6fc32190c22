"""Evaluation: episodes on separate envs stepped as one batch, returns and optional video.

The policy samples its actions (``eval.policy=sample``, as DreamerV3's reference
scores episodes) or takes their mode (``eval.policy=mode``); the metrics say which
(``dreamer.report.eval_metrics``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torchrl.envs import EnvBase
from torchrl.envs.utils import ExplorationType, set_exploration_type

from dreamer.envs.keys import PIXELS_KEY

EXPLORATION = {"sample": ExplorationType.RANDOM, "mode": ExplorationType.DETERMINISTIC}  # eval.policy


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


class _Stopped(Exception):
    """Raised from the rollout's per-step callback to leave it at once."""


@torch.no_grad()
def evaluate(env: EnvBase, policy, *, episodes: int, max_steps: int, record: bool, acting: str = "sample",
             should_stop: Callable[[], bool] = lambda: False) -> EvalResult | None:
    """``episodes`` episodes of ``policy`` (no exploration noise), its actions sampled
    or its mode (``acting``: ``eval.policy``), played by the batch ``env``
    (``make_eval_env``): each rollout plays one episode on each of its envs, stepped
    together, until ``episodes`` are done.

    An env whose episode ends early waits, unstepped, for the others (TorchRL's
    partial steps), so each keeps its first episode's return. With ``record``,
    the first env's frames up to its episode's end are returned for a video.
    ``should_stop`` is asked after every env step: once it says so the evaluation
    is abandoned and None returned (a stop signal must not wait for whole episodes).
    """
    returns, frames = [], None

    def stop_if_asked(*_) -> None:
        if should_stop():
            raise _Stopped

    with set_exploration_type(EXPLORATION[acting]):
        while len(returns) < episodes:
            if should_stop():
                return None
            try:
                rollout = env.rollout(
                    max_steps, policy, auto_cast_to_device=True, break_when_any_done=False, break_when_all_done=True,
                    callback=stop_if_asked,
                )  # (envs, T): after its episode's end, an env's row repeats its last step
            except _Stopped:
                return None
            returns += rollout["next", "episode_reward"][:, -1].reshape(-1).tolist()
            if record and frames is None and PIXELS_KEY in rollout.keys():
                done = rollout[0]["next", "done"].reshape(-1)
                length = int(done.nonzero()[0]) + 1 if done.any() else done.numel()
                frames = rollout[0, :length][PIXELS_KEY].cpu()
    return EvalResult(returns=returns[:episodes], frames=frames)

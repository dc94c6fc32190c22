"""Collector-like batches for replay and learner tests."""

from __future__ import annotations

import torch
from tensordict import TensorDict


def collector_batch(
    *,
    traj_id: int,
    first_step: int,
    steps: int,
    frame: int = 64,
    action_dim: int = 1,
    seed: int | None = None,
) -> TensorDict:
    """What a TorchRL collector hands over for one worker: a (steps,) batch with
    root and ("next") pixels, policy outputs (extra keys) and trajectory ids."""
    g = torch.Generator().manual_seed(seed if seed is not None else traj_id * 100_003 + first_step)
    pixels = torch.randint(0, 256, (steps + 1, frame, frame, 3), dtype=torch.uint8, generator=g)
    step_count = torch.arange(first_step, first_step + steps).unsqueeze(-1)
    false = torch.zeros(steps, 1, dtype=torch.bool)
    return TensorDict(
        {
            "pixels": pixels[:-1],
            "action": torch.rand(steps, action_dim, generator=g) * 4 - 2,
            "loc": torch.randn(steps, action_dim, generator=g),
            "scale": torch.rand(steps, action_dim, generator=g),
            "state": torch.randn(steps, 4, generator=g),
            "belief": torch.randn(steps, 8, generator=g),
            "step_count": step_count,
            "collector": {"traj_ids": torch.full((steps,), traj_id, dtype=torch.int64)},
            "next": {
                "pixels": pixels[1:],
                "reward": torch.randn(steps, 1, generator=g),
                "done": false.clone(),
                "terminated": false.clone(),
                "truncated": false.clone(),
                "step_count": step_count + 1,
                "belief": torch.randn(steps, 8, generator=g),
            },
        },
        batch_size=[steps],
    )

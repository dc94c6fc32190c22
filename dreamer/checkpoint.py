"""Checkpoints: atomic writes (temp file + fsync + rename), rotation, newest-first load."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch

from dreamer.errors import UserError

CHECKPOINT_DIR = "checkpoints"


def rng_state() -> dict:
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(run_dir: Path, state: dict, updates: int, keep: int) -> Path:
    """Write ``state`` as checkpoints/ckpt_<updates>.pt; never leaves a partial file."""
    directory = Path(run_dir) / CHECKPOINT_DIR
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"ckpt_{updates:010d}.pt"
    tmp = directory / f".{final.name}.tmp"
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(directory)
    for old in list_checkpoints(run_dir)[:-keep]:
        old.unlink(missing_ok=True)
    return final


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (temp files are never listed)."""
    directory = Path(run_dir) / CHECKPOINT_DIR
    return sorted(directory.glob("ckpt_*.pt")) if directory.is_dir() else []


def load_latest(run_dir: Path) -> dict:
    """The newest readable checkpoint of ``run_dir``."""
    candidates = list_checkpoints(run_dir)
    if not candidates:
        raise UserError(f"resume={run_dir}: no checkpoint in {Path(run_dir) / CHECKPOINT_DIR}")
    for path in reversed(candidates):
        try:
            return torch.load(path, map_location="cpu", weights_only=False)
        except Exception as err:  # a truncated file: fall back to the previous one
            print(f"warning: checkpoint {path} is unreadable ({err.__class__.__name__}); trying the previous one")
    raise UserError(f"resume={run_dir}: every checkpoint is unreadable")

"""Run directories as a run leaves them, made without training (for the checks that read them)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dreamer.config import load_config, to_dict
from dreamer.config.compose import compose_overrides
from dreamer.run import checkpoint as ckpt
from dreamer.run import integrity


def saved_run(run_dir: Path, overrides: list[str] = (), frames: int = 200) -> Path:
    """``run_dir`` as a run of ``overrides`` leaves it after ``frames`` frames: its config.json
    and a checkpoint holding that config and its counters."""
    config = to_dict(load_config(compose_overrides(list(overrides))))
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(config))
    ckpt.save_checkpoint(run_dir, {"config": config, "counters": {"frames": frames, "updates": 1}}, updates=1, keep=2)
    return run_dir


def write_sealed(path: Path, state: dict) -> None:
    """``state`` written to ``path`` and sealed with its digest as dreamer seals a checkpoint,
    as anyone can seal a file: what it holds, not its seal, is then what a load checks."""
    with open(path, "wb") as f:
        writer = integrity.DigestingWriter(f)
        torch.save(state, writer)
        writer.seal()

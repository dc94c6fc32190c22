"""Checkpoints: atomic writes (temp file + fsync + rename), rotation, a manifest, newest-first load.

Each ``checkpoints/ckpt_<updates>.pt`` carries a ``manifest`` (config hash,
updates, torch/torchrl versions). A file that cannot be read, or whose
manifest does not match its config (bit rot, a hand-edited file), is skipped
with one warning line and the previous checkpoint is used.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import sys
import time
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


def config_hash(config: dict) -> str:
    """A stable digest of a config dict (key order does not matter)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def make_manifest(state: dict, updates: int) -> dict:
    import torchrl

    return {
        "updates": updates,
        "config_hash": config_hash(state["config"]) if "config" in state else None,
        "torch": torch.__version__,
        "torchrl": torchrl.__version__,
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _WriteErrorRecorder:
    """A file wrapper that keeps the OS error of a failed write: torch's zip writer
    reports a short write only as "unexpected pos", hiding ENOSPC / EFBIG."""

    def __init__(self, f):
        self.f = f
        self.error: OSError | None = None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as err:
            self.error = err
            raise

    def flush(self) -> None:
        self.f.flush()


class CheckpointWriteError(UserError):
    """The disk refused a checkpoint; the previous one is untouched."""


def save_checkpoint(run_dir: Path, state: dict, updates: int, keep: int) -> Path:
    """Write ``state`` (plus its manifest) as checkpoints/ckpt_<updates>.pt.

    Never leaves a partial file: on any write error (full disk, quota, file
    size limit) the temp file is removed, older checkpoints are untouched and
    :class:`CheckpointWriteError` says so in one line.
    """
    directory = Path(run_dir) / CHECKPOINT_DIR
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob(".ckpt_*.tmp"):  # left by a process killed mid-write
        stale.unlink(missing_ok=True)
    final = directory / f"ckpt_{updates:010d}.pt"
    tmp = directory / f".{final.name}.tmp"
    state = {**state, "manifest": make_manifest(state, updates)}
    recorder = None
    try:
        with open(tmp, "wb") as f:
            recorder = _WriteErrorRecorder(f)
            torch.save(state, recorder)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except (OSError, RuntimeError) as err:
        if recorder is not None and recorder.error is not None:
            err = recorder.error
        if not isinstance(err, OSError):
            raise
        previous = list_checkpoints(run_dir)
        kept = f"the previous checkpoint {previous[-1]} is intact" if previous else "no earlier checkpoint exists"
        reason = err.strerror or errno.errorcode.get(err.errno or 0, str(err))
        raise CheckpointWriteError(
            f"could not write checkpoint {final} ({reason}); {kept}: free disk space, then resume={run_dir}"
        ) from err
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


def _read(path: Path) -> dict:
    state = torch.load(path, map_location="cpu", weights_only=False)
    manifest = state.get("manifest")
    if manifest is not None and "config" in state and manifest["config_hash"] != config_hash(state["config"]):
        raise ValueError("manifest config hash does not match the stored config")
    return state


def load_latest(run_dir: Path) -> dict:
    """The newest readable checkpoint of ``run_dir``; its path is under ``"path"``."""
    candidates = list_checkpoints(run_dir)
    if not candidates:
        raise UserError(
            f"resume={run_dir}: no checkpoint in {Path(run_dir) / CHECKPOINT_DIR}; "
            "pass the directory of a run that wrote one"
        )
    for path in reversed(candidates):
        try:
            state = _read(path)
        except Exception as err:  # truncated / corrupted: fall back to the previous one
            reason = (str(err).splitlines() or [""])[0][:200]
            print(f"warning: checkpoint {path} is unreadable ({err.__class__.__name__}: {reason}); "
                  "using the previous one", file=sys.stderr)
            continue
        state["path"] = str(path)
        return state
    raise UserError(f"resume={run_dir}: every checkpoint is unreadable")

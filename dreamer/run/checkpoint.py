"""Checkpoints: atomic writes (temp file + fsync + rename), rotation, a manifest, newest-first load.

Each ``checkpoints/ckpt_<updates>.pt`` carries a ``manifest`` (config hash,
updates, torch/torchrl versions). A file that cannot be read, or whose
manifest does not match its config (bit rot, a hand-edited file), is skipped
with one warning line and the previous checkpoint is used.

Checkpoints hold tensors and plain Python types only, and are loaded with
``torch.load(weights_only=True)``: a checkpoint file someone hands you cannot
run code. A file that needs more (a pickled object) is refused in one line.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

from dreamer.errors import UserError

CHECKPOINT_DIR = "checkpoints"


def rng_state() -> dict:
    """Every RNG stream as tensors and plain types (loadable with weights_only=True)."""
    bit_generator, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "numpy": {"bit_generator": bit_generator, "keys": torch.from_numpy(keys.astype(np.int64)),
                  "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)},
        "python": random.getstate(),
    }


def set_rng_state(state: dict) -> None:
    """Restore what fits this machine. A run checkpointed with more GPUs than are
    visible now (an 8-GPU job requeued onto 1) gets the first streams back, with a
    warning; CUDA streams saved on a CPU-only run, or restored on one, are skipped."""
    torch.set_rng_state(state["torch"])
    saved_cuda = state["cuda"] or []
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for index in range(min(len(saved_cuda), visible)):
        torch.cuda.set_rng_state(saved_cuda[index], index)
    if len(saved_cuda) > visible:
        print(f"warning: the checkpoint has {len(saved_cuda)} CUDA RNG stream(s) and {visible} CUDA device(s) "
              f"are visible: restored {min(len(saved_cuda), visible)}, the rest start afresh", file=sys.stderr)
    numpy_state = state["numpy"]
    np.random.set_state((numpy_state["bit_generator"], numpy_state["keys"].numpy().astype(np.uint32),
                         numpy_state["pos"], numpy_state["has_gauss"], numpy_state["cached_gaussian"]))
    python_state = state["python"]
    random.setstate((python_state[0], tuple(python_state[1]), python_state[2]))


def config_hash(config: dict) -> str:
    """A stable digest of a config dict (key order does not matter)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def make_manifest(state: dict, updates: int) -> dict:
    import torchrl

    return {
        "updates": updates,
        "config_hash": config_hash(state["config"]) if "config" in state else None,
        "torch": str(torch.__version__),  # a plain str: TorchVersion would be a pickled class
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
    except (OSError, RuntimeError) as caught:
        # torch.save may wrap the file's OSError in a RuntimeError: the recorder kept the original.
        err = recorder.error if recorder is not None and recorder.error is not None else caught
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


class UnsafeCheckpoint(UserError):
    """A checkpoint that would need arbitrary Python objects unpickled."""


# Older checkpoints kept numpy's RNG state as an array and torch's version as
# a TorchVersion: array reconstruction and a str subclass are data, not code,
# so those still load.
_NUMPY_CORE = getattr(np, "_core", None) or np.core  # numpy 2 renamed it
_LEGACY_SAFE_GLOBALS = [
    _NUMPY_CORE.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32)),
    torch.torch_version.TorchVersion,
]


def _read(path: Path) -> dict:
    # mmap: tensors stay in the page cache until copied into the live modules and
    # replay storage, so a saved replay is not held twice in RAM on resume.
    try:
        with torch.serialization.safe_globals(_LEGACY_SAFE_GLOBALS):
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as err:
        unsafe = (str(err).split("Unsupported global: ")[1:] or [""])[0].split(" ")[0].strip()
        raise UnsafeCheckpoint(
            f"checkpoint {path} needs Python objects unpickled{f' ({unsafe})' if unsafe else ''}, which could "
            "run code: refused (dreamer writes tensors and plain types only; do not load files you do not trust)"
        ) from None
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
        except UnsafeCheckpoint:
            raise
        except Exception as err:  # truncated / corrupted: fall back to the previous one
            reason = (str(err).splitlines() or [""])[0][:200]
            print(f"warning: checkpoint {path} is unreadable ({err.__class__.__name__}: {reason}); "
                  "using the previous one", file=sys.stderr)
            continue
        state["path"] = str(path)
        return state
    raise UserError(f"resume={run_dir}: every checkpoint is unreadable")

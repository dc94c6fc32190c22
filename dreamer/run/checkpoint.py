"""Checkpoints: atomic writes (temp file + fsync + rename), rotation, a manifest, newest-first load.

Each ``checkpoints/ckpt_<updates>.pt`` carries a ``manifest`` (config hash,
updates, torch/torchrl versions) and a sha256 of its bytes, written in the
same pass as the file and checked before it is loaded
(:mod:`dreamer.run.integrity`). A file that cannot be read, whose digest does
not match (bit rot, truncation, an edited file) or whose manifest does not
match its config is moved aside as ``ckpt_<updates>.pt.corrupt`` with one
warning line, and the previous checkpoint is used: rotation no longer counts
it, and no later resume can go back to the timeline it started. Reading
(:func:`read_latest`, the up-front checks) writes nothing; the resumed run moves
them aside once it holds the run directory's lock. When no checkpoint can be
read the resume is refused and every file is left as it is.

Checkpoints hold tensors and plain Python types only, and are loaded with
``torch.load(weights_only=True)``: a checkpoint file someone hands you cannot
run code. A file that needs more (a pickled object), or whose zip entries
declare more bytes than the file holds (a compressed entry that would inflate
in memory), is refused in one line. Running out of memory while loading is
said as such, never taken for an unreadable file.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import pickle
import random
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

from dreamer.errors import UserError
from dreamer.run import integrity

CHECKPOINT_DIR = "checkpoints"
log = logging.getLogger("dreamer")


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


class CheckpointWriteError(UserError):
    """The disk refused a checkpoint; the previous one is untouched."""


def state_bytes(state) -> int:
    """Bytes of tensor data in ``state``, each storage counted once: what torch.save
    writes, less a little zip and pickle framing."""
    seen, total, stack = set(), 0, [state]
    while stack:
        value = stack.pop()
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            key = (value.device, storage.data_ptr(), storage.nbytes())
            if key not in seen:
                seen.add(key)
                total += storage.nbytes()
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
    return total


def _with_framing(payload: int) -> int:
    return payload + payload // 100 + 4 * 2**20


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def _previous(run_dir: Path) -> str:
    previous = list_checkpoints(run_dir)
    return f"the previous checkpoint {previous[-1]} is intact" if previous else "no earlier checkpoint exists"


def check_free_space(run_dir: Path, final: Path, state: dict) -> None:
    """Refuse (one line, nothing written) a checkpoint the file system cannot hold."""
    need = _with_framing(state_bytes(state))
    free = shutil.disk_usage(final.parent).free
    if need > free:
        raise CheckpointWriteError(
            f"could not write checkpoint {final}: it needs about {_gib(need)} and its file system has {_gib(free)} "
            f"free; {_previous(run_dir)}: free disk space, then resume={run_dir}"
        )


def check_replay_checkpoint_space(run_dir: Path, replay_bytes: int, model_bytes: int, keep: int) -> None:
    """checkpoint.replay=true, checked at start: a checkpoint of the full replay buffer
    must fit on the run directory's file system (one line otherwise); keep+1 of them
    exist at peak (the new one is written before the oldest is removed), said in one
    warning line when they would not fit."""
    one = _with_framing(replay_bytes + model_bytes)
    peak = (keep + 1) * one
    free = shutil.disk_usage(run_dir).free
    existing = sum(p.stat().st_size for p in list_checkpoints(run_dir))
    sizes = (f"a checkpoint with the full replay buffer takes about {_gib(one)} ({_gib(replay_bytes)} of replay, "
             f"{_gib(model_bytes)} of weights and optimiser state), {keep + 1} of them at peak with checkpoint.keep="
             f"{keep} ({_gib(peak)})")
    if one > free:
        raise UserError(f"checkpoint.replay=true: {sizes}, but {run_dir} has {_gib(free)} free: free disk space, "
                        "lower buffer.capacity, or set checkpoint.replay=false")
    if peak > free + existing:
        log.warning("checkpoint.replay=true: %s, but %s has %s free besides its checkpoints: checkpoints will fail "
                    "once the buffer fills, unless space is freed or checkpoint.keep lowered", sizes, run_dir,
                    _gib(free + existing))


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
    check_free_space(run_dir, final, state)
    recorder = None
    try:
        with open(tmp, "wb") as f:
            recorder = integrity.DigestingWriter(f)
            torch.save(state, recorder)
            recorder.seal()
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except (OSError, RuntimeError) as caught:
        # torch.save may wrap the file's OSError in a RuntimeError: the recorder kept the original.
        err = recorder.error if recorder is not None and recorder.error is not None else caught
        if not isinstance(err, OSError):
            raise
        reason = err.strerror or errno.errorcode.get(err.errno or 0, str(err))
        raise CheckpointWriteError(
            f"could not write checkpoint {final} ({reason}); {_previous(run_dir)}: free disk space, "
            f"then resume={run_dir}"
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


def _read(path: Path) -> dict:
    try:
        integrity.check(path)  # before torch reads anything
    except integrity.OversizedFile as err:
        raise UnsafeCheckpoint(f"checkpoint {path} {err}: refused (dreamer writes uncompressed checkpoints; "
                               "do not load files you do not trust)") from None
    # mmap: tensors stay in the page cache until copied into the live modules and
    # replay storage, so a saved replay is not held twice in RAM on resume.
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as err:
        unsafe = (str(err).split("Unsupported global: ")[1:] or [""])[0].split(" ")[0].strip()
        raise UnsafeCheckpoint(
            f"checkpoint {path} needs Python objects unpickled{f' ({unsafe})' if unsafe else ''}, which could "
            "run code: refused (dreamer writes tensors and plain types only; do not load files you do not trust)"
        ) from None
    manifest = state.get("manifest")
    if manifest is None:
        raise ValueError("no manifest: not a checkpoint dreamer wrote")
    if "config" in state and manifest["config_hash"] != config_hash(state["config"]):
        raise ValueError("manifest config hash does not match the stored config")
    return state


def _out_of_memory(err: BaseException) -> bool:
    """torch reports a failed allocation as a RuntimeError, Python as MemoryError."""
    return isinstance(err, MemoryError) or (
        isinstance(err, RuntimeError) and any(s in str(err) for s in ("can't allocate memory", "not enough memory"))
    )


def move_aside(path: Path, reason: str) -> Path | None:
    """Rename an unreadable checkpoint to ``<name>.corrupt`` (kept for inspection, no
    longer a checkpoint: not listed, not rotated, never resumed); one warning line."""
    aside = path.with_name(path.name + ".corrupt")
    try:
        os.replace(path, aside)
    except OSError as err:
        print(f"warning: checkpoint {path} is unreadable ({reason}) and could not be moved aside "
              f"({err.strerror}); using the previous one", file=sys.stderr)
        return None
    print(f"warning: checkpoint {path} is unreadable ({reason}); moved aside to {aside.name}, "
          "using the previous one", file=sys.stderr)
    return aside


def read_latest(run_dir: Path) -> dict:
    """The newest readable checkpoint of ``run_dir``, read without writing anything: its
    path is under ``"path"``, and the newer ones that cannot be read under ``"unreadable"``
    as ``[path, reason]`` pairs (:func:`set_aside_unreadable` moves them aside). When none
    can be read that is one line, and every file is left as it is."""
    candidates = list_checkpoints(run_dir)
    if not candidates:
        raise UserError(
            f"resume={run_dir}: no checkpoint in {Path(run_dir) / CHECKPOINT_DIR}; "
            "pass the directory of a run that wrote one"
        )
    unreadable = []
    for path in reversed(candidates):
        try:
            state = _read(path)
        except UnsafeCheckpoint:
            raise
        except Exception as err:  # truncated / corrupted: fall back to the previous one
            if _out_of_memory(err):
                raise UserError(
                    f"resume={run_dir}: ran out of memory loading {path} ({path.stat().st_size / 2**30:.2f} GiB); "
                    "free memory or resume on a machine with more, the checkpoint is left as it is"
                ) from None
            unreadable.append([str(path), f"{err.__class__.__name__}: {(str(err).splitlines() or [''])[0][:200]}"])
            continue
        state["path"] = str(path)
        state["unreadable"] = unreadable
        return state
    reasons = "; ".join(f"{Path(path).name}: {reason}" for path, reason in unreadable[:3])
    raise UserError(f"resume={run_dir}: every checkpoint is unreadable ({reasons}); nothing was moved or "
                    f"changed in {Path(run_dir) / CHECKPOINT_DIR}: restore a good copy, or start a new run")


def set_aside_unreadable(state: dict) -> None:
    """Move the checkpoints :func:`read_latest` could not read aside (:func:`move_aside`): the
    run resuming from ``state`` holds the run directory's lock by now."""
    for path, reason in state.get("unreadable", ()):
        if Path(path).exists():
            move_aside(Path(path), reason)


def load_latest(run_dir: Path) -> dict:
    """The newest readable checkpoint of ``run_dir`` (:func:`read_latest`), the newer
    unreadable ones moved aside (:func:`move_aside`)."""
    state = read_latest(run_dir)
    set_aside_unreadable(state)
    return state

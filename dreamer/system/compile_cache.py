"""Warm compile starts: inductor's on-disk cache and portable cache artifacts.

Two mechanisms, both torch's own:

- ``compile.cache_dir`` points ``TORCHINDUCTOR_CACHE_DIR`` at a persistent
  directory. A populated directory holds the compiled C++ (on CPU) or Triton
  kernels, so a later start skips code generation and the C++ compiler.
- ``torch.compiler.save_cache_artifacts()`` serialises what this process
  compiled into one portable file, ``<run dir>/compile_cache.bin``, written
  after the learner's warm-up; ``compile.cache_artifact=PATH`` (or a resumed
  run's own file) loads it with ``load_cache_artifacts`` before compiling, on
  this or another machine.

torch unpickles the entries of a loaded artifact on a cache hit, so loading
one can run code: only files that are the user's or the run's own are loaded
(:func:`artifact_to_load`). A resumed run's own ``compile_cache.bin`` is
loaded only when the checkpoint (read with ``weights_only=True``) records its
sha256 and the bytes match: a file planted beside, swapped into or corrupted in
a run directory is skipped with one line. A checkpoint crafted together with
the file can vouch for it: the digest proves the file is the one the
checkpoint's writer wrote, not who that writer was.

The directory is set before the collectors spawn, so workers that compile their
policy inherit it through the environment.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from dreamer.config import CompileConfig
from dreamer.errors import UserError

log = logging.getLogger("dreamer")

ARTIFACT_NAME = "compile_cache.bin"


def use_cache_dir(cc: CompileConfig) -> str | None:
    """Point inductor at ``compile.cache_dir``; returns the directory in use."""
    if cc.cache_dir is None:
        return os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    path = Path(cc.cache_dir).expanduser().resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"compile.cache_dir={cc.cache_dir} cannot be created ({err.strerror}): "
                        "choose a writable directory") from None
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    return str(path)


@dataclass(frozen=True)
class Artifact:
    """A compile-cache file to load; ``sha256``: the digest its bytes must have (a run
    directory's own file), None for a file the user named."""

    path: Path
    sha256: str | None = None


def check_given_artifact(cc: CompileConfig) -> None:
    """A ``compile.cache_artifact`` given on the command line must exist (one saved in a
    resumed run's config may be gone: :func:`artifact_to_load` skips it with a warning)."""
    if cc.cache_artifact is not None and not Path(cc.cache_artifact).expanduser().is_file():
        raise UserError(f"compile.cache_artifact={cc.cache_artifact} does not exist: pass the "
                        f"{ARTIFACT_NAME} of an earlier run, or drop the override")


def artifact_to_load(cc: CompileConfig, run_dir: Path, *, resumed: bool = False, given: bool = True,
                     vouched_sha256: str | None = None) -> Artifact | None:
    """What to load into torch's compile caches before compiling.

    ``given``: ``compile.cache_artifact`` comes from this command line (always, for
    a new run), not from a resumed run's saved config. A given file that does not
    exist is an error; a saved one that is gone (a cleaned scratch directory, a
    requeue on another node) is one warning line and is skipped, as is a saved one
    inside the run directory (a run directory's files load only as its own artifact).
    Otherwise a resumed run loads its own ``compile_cache.bin`` when the checkpoint
    vouches for it (``vouched_sha256``).
    """
    if cc.cache_artifact is not None:
        path = Path(cc.cache_artifact).expanduser()
        if given:
            check_given_artifact(cc)
            return Artifact(path)
        if not path.is_file():
            log.warning("compile.cache_artifact=%s (from the saved config) no longer exists: not loaded, compiling "
                        "without it", cc.cache_artifact)
        elif not path.resolve().is_relative_to(Path(run_dir).resolve()):
            return Artifact(path)
    own = Path(run_dir) / ARTIFACT_NAME
    if not resumed or not own.is_file():
        return None
    return Artifact(own, vouched_sha256 or "")  # "": nothing vouches for it, load_artifact skips it


def read_artifact(artifact: Artifact) -> bytes | None:
    """The artifact's bytes, or None (one line) when they lack the digest it requires."""
    path = artifact.path
    data = path.read_bytes()
    if artifact.sha256 is None:
        return data
    if not artifact.sha256:
        log.warning("compile cache %s not loaded: the checkpoint records no sha256 for it (not written by the "
                    "run that wrote the checkpoint); compiling from scratch", path)
        return None
    if hashlib.sha256(data).hexdigest() != artifact.sha256:
        log.warning("compile cache %s not loaded: its sha256 differs from the one the checkpoint records "
                    "(replaced or corrupted); compiling from scratch", path)
        return None
    return data


def load_artifact(artifact: Artifact | Path) -> bool:
    """Pre-populate torch's compile caches from the artifact's file; False (one line) if
    its bytes lack the digest it requires or torch rejects them."""
    if isinstance(artifact, Path):
        artifact = Artifact(artifact)
    data = read_artifact(artifact)
    return data is not None and load_bytes(data, artifact.path)


def load_bytes(data: bytes, path: Path) -> bool:
    """Pre-populate torch's compile caches from ``data`` (read from ``path``); False if torch rejects it."""
    try:
        info = torch.compiler.load_cache_artifacts(data)
    except Exception as err:  # another torch version, a truncated file: compile cold
        info, reason = None, str(err)
    else:
        reason = "torch could not read it"  # torch logs why and returns None
    if info is None:
        log.warning("compile cache %s not loaded (%s); compiling from scratch", path, reason)
        return False
    log.info("compile cache loaded from %s (%s)", path, _describe(info))
    return True


def cache_lookups() -> dict[str, int]:
    """This process's compile-cache lookups so far (torch's own counters): hits
    and misses of the FX-graph (inductor) and AOTAutograd caches."""
    from torch._dynamo.utils import counters

    inductor, aot = counters["inductor"], counters["aot_autograd"]
    return {
        "hits": inductor["fxgraph_cache_hit"] + aot["autograd_cache_hit"],
        "misses": inductor["fxgraph_cache_miss"] + aot["autograd_cache_miss"],
    }


def lookups_since(before: dict[str, int]) -> dict[str, int]:
    now = cache_lookups()
    return {kind: now[kind] - before[kind] for kind in now}


def save_artifact(run_dir: Path) -> str | None:
    """Write what this process compiled to ``<run_dir>/compile_cache.bin`` (atomically);
    returns its sha256 (the checkpoint records it), None when nothing was compiled."""
    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        return None
    data, info = saved
    final = Path(run_dir) / ARTIFACT_NAME
    tmp = final.with_name(f".{final.name}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    log.info("compile cache saved to %s (%.1f MiB, %s)", final, len(data) / 2**20, _describe(info))
    return hashlib.sha256(data).hexdigest()


def _describe(info) -> str:
    if info is None or info.empty():
        return "no entries"
    return ", ".join(f"{kind}={len(keys)}" for kind, keys in sorted(info.artifacts.items()))

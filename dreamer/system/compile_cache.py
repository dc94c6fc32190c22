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

The directory is set before the collectors spawn, so workers that compile their
policy inherit it through the environment.
"""

from __future__ import annotations

import logging
import os
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


def artifact_to_load(cc: CompileConfig, run_dir: Path, resumed: bool) -> Path | None:
    """The explicit ``compile.cache_artifact``, else a resumed run's own artifact."""
    if cc.cache_artifact is not None:
        path = Path(cc.cache_artifact).expanduser()
        if not path.is_file():
            raise UserError(f"compile.cache_artifact={cc.cache_artifact} does not exist: pass the "
                            f"{ARTIFACT_NAME} of an earlier run, or drop the override")
        return path
    own = Path(run_dir) / ARTIFACT_NAME
    return own if resumed and own.is_file() else None


def load_artifact(path: Path) -> bool:
    """Pre-populate torch's compile caches from ``path``; False if torch rejects it."""
    try:
        info = torch.compiler.load_cache_artifacts(path.read_bytes())
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


def save_artifact(run_dir: Path) -> Path | None:
    """Write what this process compiled to ``<run_dir>/compile_cache.bin`` (atomically)."""
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
    return final


def _describe(info) -> str:
    if info is None or info.empty():
        return "no entries"
    return ", ".join(f"{kind}={len(keys)}" for kind, keys in sorted(info.artifacts.items()))

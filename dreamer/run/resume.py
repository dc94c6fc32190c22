"""Resume: the saved config wins; only an allow-list of keys may change.

A resumed run continues with the config it was started with. Keys in
:data:`RESUME_OVERRIDABLE` (run length, logging, evaluation, checkpointing)
may be changed on the command line, and only those given change; any other
override that would change the saved config is refused in one line, never
silently ignored.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from dreamer.config import Config, load_config, to_dict
from dreamer.errors import UserError
from dreamer.run import checkpoint as ckpt

# Dotted keys (a section name covers all its keys) a resumed run may change.
RESUME_OVERRIDABLE = (
    "train.total_frames", "train.max_minutes", "logger", "eval", "checkpoint", "resume",
    "compile.cache_dir", "compile.cache_artifact", "compile.background_timeout_minutes", "profiling",
    "retain_host_memory",
    # Where it runs: a requeued job may land on another node (another GPU, CPU only, fewer cores).
    "device", "collector.num_workers", "threads", "cuda_fast_math",
)


def flatten(config: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict) and value and key != "options":
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def overridable(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in RESUME_OVERRIDABLE)


def differing_keys(a: dict, b: dict) -> list[str]:
    """Dotted keys whose values differ between two config dicts (missing counts as different)."""
    fa, fb = flatten(a), flatten(b)
    return sorted(k for k in fa.keys() | fb.keys() if fa.get(k, object()) != fb.get(k, object()))


def _touched(key: str, overridden: set[str]) -> bool:
    """Whether the command line gave ``key``: named itself, a section above it, or a key
    inside it (a dict-valued leaf such as compile.options)."""
    return any(key == k or key.startswith(k + ".") or k.startswith(key + ".") for k in overridden)


def given_on_command_line(key: str, overridden: set[str]) -> bool:
    """Whether this command line set ``key`` (named, or through a section or group)."""
    return _touched(key, overridden)


def merge(saved: dict, requested: Config, overridden: set[str]) -> Config:
    """The saved config, with the allow-listed keys this command line gave taken from
    it. A key it did not give keeps the saved run's value: ``resume=DIR`` alone
    continues the run as it was configured (its logger, evaluation, workers), not
    with this invocation's defaults."""
    merged = json.loads(json.dumps(saved))
    current = flatten(to_dict(requested))
    given = {key for key in current if overridable(key) and _touched(key, overridden | {"resume"})}
    for key in given:
        *path, leaf = key.split(".")
        node = merged
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = current[key]
    return load_config(merged)


def refuse_overrides(saved: dict, requested: Config, overridden: set[str]) -> None:
    """Fail on any override the user gave that would change a non-overridable saved key."""
    want, have = flatten(to_dict(requested)), flatten(saved)
    # An override may name a leaf (buffer.batch_size) or reach inside a dict leaf (compile.options.x).
    touched = {f for f in want if _touched(f, overridden)}
    refused = sorted(k for k in touched if not overridable(k) and want[k] != have.get(k, object()))
    if refused:
        shown = ", ".join(f"{k} (saved {have.get(k)!r}, given {want[k]!r})" for k in refused[:5])
        sections = {k for k, v in to_dict(Config()).items() if isinstance(v, dict)}
        allowed = ", ".join(k + ".*" if k in sections else k for k in RESUME_OVERRIDABLE if k != "resume")
        raise UserError(
            f"resume={requested.resume} keeps the run's saved config; refused override: {shown}. "
            f"Only {allowed} may change on resume; start a new run to change the rest"
        )


def check_compatible(run_dir: Path, state: dict) -> None:
    """A checkpoint must come from this run's config (e.g. not copied in from another run)."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        return
    run_config = json.loads(path.read_text())
    differing = [k for k in differing_keys(run_config, state["config"]) if not overridable(k)]
    if differing:
        raise UserError(
            f"checkpoint {state['path']} was written with a different config than {path}: "
            f"differing keys {', '.join(differing)}; resume the run that wrote it, or remove it"
        )


def refuse_run_dir_with_checkpoints(run_dir: Path) -> None:
    """A fresh run never writes into a run that can be resumed (its metrics and checkpoints would mix)."""
    if ckpt.list_checkpoints(run_dir):
        raise UserError(
            f"{run_dir} already holds checkpoints of a run: continue it with resume={run_dir}, "
            "or choose another hydra.run.dir"
        )


def run_dir_to_resume(requested: Config) -> Path:
    """The directory ``resume=`` names; one line if it does not exist."""
    run_dir = Path(requested.resume)
    if not run_dir.is_dir():
        raise UserError(f"resume={run_dir}: no such directory; pass a run directory (it holds checkpoints/)")
    return run_dir


def check_resume_dir_writable(run_dir: Path) -> None:
    """The resumed run continues writing into its directory (checkpoints, records), so it must be writable."""
    try:
        with tempfile.TemporaryFile(dir=run_dir):
            pass
    except OSError as err:
        raise UserError(
            f"resume={run_dir} cannot be written ({err.strerror or err}): a resumed run writes its checkpoints "
            "and records there; make it writable (or copy the run directory somewhere writable and resume that)"
        ) from None


def open_run(requested: Config, overridden: set[str]) -> tuple[Path, Config, dict]:
    """(run_dir, config to use, checkpoint state) for ``resume=RUN_DIR``: the directory
    exists and can be written, and the newest readable checkpoint allows these overrides.
    Reads only (the state lists the checkpoints the run will move aside)."""
    run_dir = run_dir_to_resume(requested)
    check_resume_dir_writable(run_dir)
    state = ckpt.read_latest(run_dir)
    refuse_overrides(state["config"], requested, overridden)
    check_compatible(run_dir, state)
    return run_dir, merge(state["config"], requested, overridden), state


def refuse_checkpoints_written_since(run_dir: Path, state: dict) -> None:
    """The checkpoint read before the run directory was locked (``state``, from
    :func:`open_run`) is still the newest: no other run wrote one in between."""
    read = Path(state["path"]).name
    known = {Path(path).name for path, _ in state.get("unreadable", ())}
    newer = [p.name for p in ckpt.list_checkpoints(run_dir) if p.name > read and p.name not in known]
    if newer:
        raise UserError(f"resume={run_dir}: {newer[-1]} was written while this run started (another run writes "
                        "there): start this one again once that run has stopped")

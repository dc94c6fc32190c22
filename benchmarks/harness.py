"""What every benchmark here shares: a preset composed as ``python -m dreamer`` composes it, our
learner with a replay filled by its acting policy, timed calls (median wall and process-CPU
seconds), and a JSON report that names the machine it was measured on.

Benchmarks import it by name (``from harness import ...``): ``python benchmarks/NAME.py`` puts
this folder first on ``sys.path``. Nothing here imports ``dreamer`` at module level, so a peer's
side of a benchmark can run in a Python without it (benchmarks/peers.py's sheeprl venv).
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]


def compose(overrides: list[str]):
    """The validated config ``python -m dreamer OVERRIDES`` would run."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from dreamer.config import load_config, register_configs
    from dreamer.config.location import conf_dir

    register_configs()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return load_config(hydra_compose("config", overrides=overrides))


def build(cfg, fill_steps: int | None = None):
    """(learner, replay) on the CPU, the replay filled by ``fill_steps`` steps of the acting policy
    (default: 4 batches of sequences, at least 1000) as a collector would fill it; prefetch off, so
    nothing runs beside the timing. With ``retain_host_memory`` (the default) this process's malloc
    keeps freed memory, as the app's learner process does (dreamer/run/build.py)."""
    import torch

    from dreamer.algos.registry import algorithm
    from dreamer.data.replay import make_replay_buffer, write
    from dreamer.envs.factory import close_env, make_env
    from dreamer.system.memory import retain_freed_host_memory
    from torchrl_ext.tensordict_fast_path import install_from_any_fast_path

    install_from_any_fast_path()  # as the app's learner process has it (dreamer/__main__.py)
    if cfg.retain_host_memory:
        retain_freed_host_memory()
    cfg.buffer.prefetch = 0
    cpu = torch.device("cpu")
    env = make_env(cfg.env, cfg.algo, seed=cfg.seed)
    try:
        build_models, learner_cls = algorithm(cfg.algo.name)
        models = build_models(cfg.algo, cfg.env, env, cpu)
        learner = learner_cls(cfg.algo, cfg.compile, models, cpu,
                              batch_size=cfg.buffer.batch_size, batch_length=cfg.buffer.batch_length)
        replay = make_replay_buffer(cfg.buffer, cpu)
        steps = fill_steps or max(4 * cfg.buffer.batch_size * cfg.buffer.batch_length, 1000)
        with torch.no_grad():
            rollout = env.rollout(steps, models.policy(explore=True), break_when_any_done=False)
    finally:
        close_env(env)
    rollout["collector", "traj_ids"] = torch.zeros(rollout.shape[0], dtype=torch.long)
    write(replay, rollout, models.obs_key)
    return learner, replay


def time_calls(call: Callable, next_input: Callable, warmup: int, reps: int) -> dict:
    """Median wall and process-CPU seconds of ``reps`` calls of ``call(next_input())`` after ``warmup``
    untimed ones (``next_input`` runs outside the timing): ``wall_s``, ``cpu_s`` and every wall time
    (process CPU time is the steadier figure on a shared machine)."""
    for _ in range(warmup):
        call(next_input())
    walls, cpus = [], []
    for _ in range(reps):
        arg = next_input()
        wall, cpu = time.perf_counter(), time.process_time()
        call(arg)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return {"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus), "walls": walls}


def median_or_none(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def cpu_model() -> str:
    """The CPU's model name as ``lscpu`` prints it (the same name can hide machines of different
    speed: quote it beside every figure, never as a promise)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def machine() -> dict:
    import os

    import torch

    info = {"cpu": cpu_model(), "cores": os.cpu_count(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def write_report(path: Path | None, result: dict) -> None:
    """``result`` with the machine it was measured on, as JSON at ``path`` (nothing when None)."""
    if path is not None:
        Path(path).write_text(json.dumps({"machine": machine(), **result}, indent=2))

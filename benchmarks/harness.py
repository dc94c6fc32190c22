"""What every benchmark here shares: a preset composed as ``python -m dreamer`` composes it, our
learner with a replay filled by its acting policy, timed calls (median wall and process-CPU
seconds), sides of a side-by-side benchmark each in its own process (``SideProcess`` / ``serve``),
and a JSON report that names the machine it was measured on.

Benchmarks import it by name (``from harness import ...``): ``python benchmarks/NAME.py`` puts
this folder first on ``sys.path``. Nothing here imports ``dreamer`` or ``torch`` at module level, so a
peer's side of a benchmark can run in a Python without them (benchmarks/peers.py's sheeprl venv).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import typing
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
# The config key that picks our update path, and its values: ``losses`` (the design card's: world model
# eager, actor/value losses compiled), ``whole`` (the one-function update compiled, no graph) and
# ``captured`` (that update in CUDA graphs; CUDA only). One place to rename it.
UPDATE_PATH_KEY = "compile.update"
# Module rows of the parameter tables -> our learner.models.modules keys; peers count theirs per row.
PARAM_ROWS = {
    "encoder": ["encoder"], "decoder": ["decoder"], "rssm prior (GRU + prior head)": ["prior"],
    "rssm posterior": ["posterior"], "reward": ["reward"], "continue": ["continuation"],
    "actor": ["actor"], "critic": ["value"],
}


def compose(overrides: list[str]):
    """The validated config ``python -m dreamer OVERRIDES`` would run."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from dreamer.config import load_config, register_configs
    from dreamer.config.location import conf_dir

    register_configs()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return load_config(hydra_compose("config", overrides=overrides))


def build(cfg, fill_steps: int | None = None, random_actions: bool = False):
    """(learner, replay) on ``cfg.device`` (``auto`` and ``cpu``: the CPU), the replay filled by
    ``fill_steps`` steps (default: 4 batches of sequences, at least 1000) of the acting policy as a
    collector would fill it, or of random actions (``random_actions``: what a GPU-sized model would
    take minutes to act on a CPU for); prefetch off, so nothing runs beside the timing. Autocast and
    CUDA math as the app sets them (``cfg.autocast``, ``cfg.cuda_fast_math``); with
    ``retain_host_memory`` (the default) this process's malloc keeps freed memory, as the app's learner
    process does (dreamer/run/build.py)."""
    import torch

    from dreamer.algos.registry import algorithm
    from dreamer.data.replay import make_replay_buffer, write
    from dreamer.envs.factory import close_env, make_env
    from dreamer.system.device import configure_cuda_math, resolve_autocast
    from dreamer.system.memory import retain_freed_host_memory
    from torchrl_ext.tensordict_fast_path import install_from_any_fast_path

    install_from_any_fast_path()  # as the app's learner process has it (dreamer/__main__.py)
    if cfg.retain_host_memory:
        retain_freed_host_memory()
    cfg.buffer.prefetch = 0
    device = torch.device("cpu" if cfg.device == "auto" else cfg.device)
    autocast = resolve_autocast(cfg.autocast, device)
    configure_cuda_math(device, cfg.cuda_fast_math)
    env = make_env(cfg.env, cfg.algo, seed=cfg.seed)
    try:
        build_models, learner_cls = algorithm(cfg.algo.name)
        models = build_models(cfg.algo, cfg.env, env, device)
        learner = learner_cls(cfg.algo, cfg.compile, models, device, batch_size=cfg.buffer.batch_size,
                              batch_length=cfg.buffer.batch_length, autocast_dtype=autocast)
        replay = make_replay_buffer(cfg.buffer, device)
        steps = fill_steps or max(4 * cfg.buffer.batch_size * cfg.buffer.batch_length, 1000)
        policy = None if random_actions else models.policy(explore=True)
        with torch.no_grad():
            rollout = env.rollout(steps, policy, break_when_any_done=False).to("cpu")
    finally:
        close_env(env)
    rollout["collector", "traj_ids"] = torch.zeros(rollout.shape[0], dtype=torch.long)
    write(replay, rollout, models.obs_key)
    return learner, replay


def time_calls(call: Callable, next_input: Callable, warmup: int, reps: int,
               sync: Callable[[], None] = lambda: None) -> dict:
    """Median wall and process-CPU seconds of ``reps`` calls of ``call(next_input())`` after ``warmup``
    untimed ones (``next_input`` runs outside the timing): ``wall_s``, ``cpu_s`` and every wall time
    (process CPU time is the steadier figure on a shared machine). ``sync`` waits for the device
    (``torch.cuda.synchronize`` on a GPU) before each call starts and before it is counted done."""
    for _ in range(warmup):
        call(next_input())
    walls, cpus = [], []
    for _ in range(reps):
        arg = next_input()
        sync()
        wall, cpu = time.perf_counter(), time.process_time()
        call(arg)
        sync()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return {"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus), "walls": walls}


def time_back_to_back(call: Callable, next_input: Callable, reps: int,
                      sync: Callable[[], None] = lambda: None) -> float:
    """Seconds per call of ``reps`` calls issued back to back, as training issues them: the inputs drawn
    first, one ``sync`` before the first call and one after the last, none between (on a GPU the host
    queues the next update while the device runs this one)."""
    args = [next_input() for _ in range(reps)]
    sync()
    wall = time.perf_counter()
    for arg in args:
        call(arg)
    sync()
    return (time.perf_counter() - wall) / reps


def math_flags() -> dict:
    """The float32 math settings this process's torch runs with (what dreamer.system.device's
    ``configure_cuda_math`` sets on CUDA): sides of one comparison must agree on them."""
    import torch

    return {"float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32, "cudnn.benchmark": torch.backends.cudnn.benchmark}


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


# -- our update path --------------------------------------------------------------------------------------
def schema_has(key: str) -> bool:
    """Whether our config schema (dreamer/config/schema.py) has the dotted ``key``: a side that needs a key
    that has not landed yet skips instead of failing."""
    from dreamer.config.schema import Config

    node = Config
    for part in key.split("."):
        hints = typing.get_type_hints(node) if dataclasses.is_dataclass(node) else {}
        if part not in hints:
            return False
        node = hints[part]
    return True


def update_path_overrides(path: str) -> tuple[list[str], str | None]:
    """(Hydra overrides that run our update path ``path``, None), or ([], why it cannot run here): before
    UPDATE_PATH_KEY exists, a checkout's learner is the compiled-losses path and the others do not exist."""
    if schema_has(UPDATE_PATH_KEY):
        return [f"{UPDATE_PATH_KEY}={path}"], None
    if path == "losses":
        return [], None
    return [], f"our {path} update path needs {UPDATE_PATH_KEY}, which this checkout's config schema lacks"


def shipped_update_path(cfg) -> str:
    """The update path ``cfg`` runs on its device as composed: ``eager`` with compile off, else what
    UPDATE_PATH_KEY resolves to (``auto`` -> the path the learner picks; ``losses`` before that key exists)."""
    if not cfg.compile.enabled:
        return "eager"
    if not schema_has(UPDATE_PATH_KEY):
        return "losses"
    import torch

    from dreamer.algos.update_paths import resolve_update_path

    device = torch.device("cpu" if cfg.device == "auto" else cfg.device)
    return resolve_update_path(cfg.compile, device).value


# -- sides of a side-by-side benchmark, each in its own process -------------------------------------------
@dataclasses.dataclass
class Built:
    """A side, built inside its own process."""

    update: Callable  # batch -> None: one training update
    next_batch: Callable  # () -> batch, outside the timing
    params: dict  # PARAM_ROWS row -> parameters
    compile_warmup_s: float | None = None
    sync: Callable[[], None] = lambda: None  # waits for the side's device: time_calls's ``sync``
    math: dict | None = None  # math_flags() of a torch side whose flags we set (ours, TorchRL's)


def count_params(*modules) -> int:
    return sum(p.numel() for m in modules for p in m.parameters())


def build_ours(spec: dict) -> Built:
    """Our learner (``spec["overrides"]``) and a replay filled as :func:`build` fills it (``fill_steps``,
    ``random_actions``), compiled and warmed up before its first timed update where ``compile.enabled``
    (the warm-up's seconds reported: cold unless compile.cache_dir holds a warm cache)."""
    import torch

    from dreamer.system import compile_cache

    cfg = compose(spec["overrides"])
    torch.manual_seed(cfg.seed)
    learner, replay = build(cfg, spec.get("fill_steps"), spec.get("random_actions", False))
    modules = learner.models.modules
    params = {row: count_params(*(modules[k] for k in keys)) for row, keys in PARAM_ROWS.items()}
    if cfg.compile.enabled:
        compile_cache.use_cache_dir(cfg.compile)
    learner.compile()  # as the app does with compile off too: compile.update=captured captures the eager update
    warmup_s = learner.warmup(replay.sample()) if cfg.compile.enabled else None
    sync = torch.cuda.synchronize if learner.device.type == "cuda" else (lambda: None)
    return Built(learner.update, replay.sample, params, warmup_s, sync, math_flags())


def serve(builders: dict[str, Callable[[dict], Built]], spec: dict) -> int:
    """A side's process: ``builders[spec["kind"]](spec)``, say so (parameters, compile warm-up, build
    seconds, or the error that stopped the build), then time rounds on request. Replies are JSON lines on
    the real stdout; anything the libraries print goes to stderr (the parent's log file)."""
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    if spec.get("threads"):
        import torch

        torch.set_num_threads(spec["threads"])
    start = time.perf_counter()
    try:
        side = builders[spec["kind"]](spec)
    except Exception as err:  # the parent reports it as this side's failure (its log has the traceback)
        import traceback

        traceback.print_exc()
        replies.write(json.dumps({"error": f"{type(err).__name__}: {str(err).strip()}".splitlines()[0][:400]}) + "\n")
        return 1
    replies.write(json.dumps({"params": side.params, "compile_warmup_s": side.compile_warmup_s,
                              "build_s": time.perf_counter() - start, "math": side.math}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "stop":
            break
        timed = time_calls(side.update, side.next_batch, request["warmup"], request["reps"], side.sync)
        if request.get("back_to_back"):
            timed["back_to_back_s"] = time_back_to_back(side.update, side.next_batch, request["reps"], side.sync)
        replies.write(json.dumps(timed) + "\n")
    return 0


class SideFailed(RuntimeError):
    """A side's process died, hung, or reported that its build failed."""


class SideTimeout(SideFailed):
    """A side's process said nothing within the time it was given (it is stopped)."""


class SideProcess:
    """One side in its own process (``python SCRIPT --serve SPEC``, which calls :func:`serve`), spoken to
    in JSON lines; its output goes to a log file, whose tail a failure carries. Starting it returns at
    once: :meth:`built` waits for its build, so several sides can build side by side."""

    def __init__(self, name: str, python: str, script: Path, spec: dict, *, threads: int | None = None,
                 env: dict | None = None, timeout_s: float = 1800):
        self.name, self.timeout_s, self.info = name, timeout_s, None
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"side_{name}_", suffix=".log")
        env = {**os.environ, **(env or {}), **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
        # Its own process group: a side killed mid-build takes its compile workers with it.
        self.proc = subprocess.Popen([python, str(script), "--serve", json.dumps(spec)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=env,
                                     start_new_session=True)

    def built(self, timeout_s: float | None = None) -> dict:
        """Its build reply (``params``, ``compile_warmup_s``, ``build_s``, ``math``), waiting at most ``timeout_s``."""
        if self.info is None:
            self.info = self._reply("build", timeout_s)
        return self.info

    def time(self, warmup: int, reps: int, back_to_back: bool = False) -> dict:
        """``warmup`` untimed updates, then :func:`time_calls`'s figures for ``reps`` timed ones (and with
        ``back_to_back``, :func:`time_back_to_back`'s ``back_to_back_s`` for ``reps`` more)."""
        try:
            request = {"op": "time", "warmup": warmup, "reps": reps, "back_to_back": back_to_back}
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # _reply reports the dead process
        return self._reply("time")

    def _reply(self, what: str, timeout_s: float | None = None) -> dict:
        timeout_s = self.timeout_s if timeout_s is None else max(timeout_s, 0.0)
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline() if ready else ""
        reply = json.loads(line) if line else None
        if reply is not None and "error" not in reply:
            return reply
        alive = self.proc.poll() is None
        self.log.flush()
        self.log.seek(0)
        tail = "".join(self.log.readlines()[-25:])
        self.kill()
        if reply is not None:
            raise SideFailed(f"{tail}\nthe {self.name} side failed on {what!r}: {reply['error']}")
        if alive:
            raise SideTimeout(f"{tail}\nthe {self.name} side said nothing on {what!r} within {timeout_s:.0f} s")
        raise SideFailed(f"{tail}\nthe {self.name} side's process died on {what!r} "
                         f"(exit code {self.proc.returncode}; its log above)")

    def stop(self) -> None:
        """Ask it to stop (kill it if it does not within 60 s); idempotent."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "stop"}) + "\n")
                self.proc.stdin.close()
            except (BrokenPipeError, ValueError):
                pass
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def kill(self) -> None:
        """End its process group now (a hung or failed side, or one cut by a time budget); idempotent."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        if not self.log.closed:
            self.log.close()

"""The GPU acceptance checks: one PASS / FAIL / SKIP line per check.

    python scripts/gpu_check.py                  # everything this machine can check
    python scripts/gpu_check.py --json out.json  # and the results as JSON
    python scripts/gpu_check.py --cpu-only       # the CPU-provable subset only (what CI runs)
    python scripts/gpu_check.py --only "NaN reward" "MUJOCO_GL"
                                                 # the checks whose names hold these texts (a rerun)
    python scripts/gpu_check.py --gpu-only --quick --budget-s 540 --pytest-workers 8
                                                 # a lent GPU for minutes: the GPU checks, most telling first

Every machine runs the CPU-provable subset: the tests marked
``@pytest.mark.gpu_acceptance(CHECK)`` (one report line per CHECK; the names are in
tests/support/gpu_checks.py), which prove each fix of the CUDA path on the CPU, with CUDA stood in for where the
path needs it: no host transfer inside V1/V3 updates (also with two ranks
voting), checkpoint -> resume on CPU and a GPU-shaped checkpoint (8 CUDA RNG
states) where fewer GPUs are visible, a NaN reward skipped, counted and
leaving the weights, workers' policy tensors on the collector device, replay
storage page-locked exactly with samples gathered into reused staging
batches and copied on a side stream behind an event, the replay size checked
per node against cgroup limits and VRAM, weight pushes that never wait,
worker and thread counts from affinity / quota / ranks, one-line CUDA errors.

Without CUDA it says so in one line, lists the GPU checks as SKIP, and exits 0
when the subset passes. With CUDA it also runs:

- the CUDA-only tests (``@pytest.mark.cuda(CHECK)``): sync-debug "error" mode around compiled V1 and V3
  updates (states and pixels, bf16 autocast where native, no re-trace after
  warm-up), replay sampling and weight pushes without a sync, NaN reward on
  CUDA, pixel transforms on CUDA;
- page-locked replay memory: resident bytes against the replay size (no
  power-of-two rounding);
- ``experiment=smoke device=cuda collector.num_workers=2``: only the learner
  holds a CUDA context (its workers map no GPU); steady updates/s with
  ``compile=off`` / ``on`` x ``autocast=off`` / ``auto``;
- ``experiment=dmc_vision_v3 model=size12m`` (V3, DMC pixels, ~200 updates):
  updates/s, first-update (compile warm-up) time, resident memory against the
  logged replay size;
- a profiled window: no device-to-host copy or synchronize call inside the
  learner's update ranges;
- checkpoint on the GPU, resume on the GPU and on the CPU; with fewer GPUs
  visible (2 or more GPUs);
- torchrun on 2 GPUs: ``max_param_divergence == 0``, updates/s against 1 GPU;

Exit status 0 when no check failed, 1 otherwise. Runs land in a temporary
directory (``--keep DIR`` keeps them, and their logs, under DIR/<date-time>).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path

from analyze_trace import iter_events

REPO = Path(__file__).resolve().parents[1]
PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"

PAGE_LOCKED = "page-locked replay memory: resident bytes = replay size (no power-of-two rounding)"
SMOKE_CONTEXTS = "smoke on CUDA, 2 workers: only the learner holds a CUDA context"
SMOKE_RATES = "smoke on CUDA: steady updates/s, compile off/default x autocast off/auto"
V3_PIXELS = ("V3 size12m on pixels (DMC; Pendulum without dm_control; ~200 updates): updates/s, first update, "
             "memory, background compile on CUDA")
PROFILED = "profiled window: no device-to-host copy or synchronize inside an update"
RESUME = "checkpoint on the GPU -> resume on the GPU and on the CPU"
FEWER_GPUS = "checkpoint with 2 GPUs -> resume with 1 visible"
TORCHRUN = "torchrun on 2 GPUs: max_param_divergence == 0, updates/s against 1 GPU"
# In the order they run: most telling first, so that a short --budget-s keeps what matters.
GPU_RUN_CHECKS = [PAGE_LOCKED, SMOKE_CONTEXTS, SMOKE_RATES, PROFILED, RESUME, V3_PIXELS, FEWER_GPUS, TORCHRUN]


@dataclass
class Result:
    check: str
    status: str
    detail: str = ""
    seconds: float = 0.0

# Our own worker count and nothing cached: the project's addopts (``-n auto``) replaced, so a
# machine without pytest-xdist runs the checks in one process.
OWN_PYTEST_OPTIONS = ("-p", "no:cacheprovider", "-o", "addopts=--strict-markers")


def _print(result: Result) -> None:
    detail = f"  ({result.detail})" if result.detail else ""
    print(f"{result.status} {result.check}{detail}", flush=True)


# -- pytest -----------------------------------------------------------------------


def collect_checks() -> dict[str, list[tuple[str, list[str]]]]:
    """Per marker (gpu_acceptance, cuda): (check, node ids) of its tests in collection order.
    One pytest collection for both (collecting the suite costs seconds): tests/conftest.py names
    each test's check."""
    markers = ("gpu_acceptance", "cuda")
    with tempfile.TemporaryDirectory(prefix="gpu_check_collect_") as tmp:
        listing = Path(tmp) / "checks.json"
        proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *OWN_PYTEST_OPTIONS,
                               "-m", " or ".join(markers), f"--gpu-checks-json={listing}"], cwd=REPO,
                              capture_output=True, text=True, env=_env(), stdin=subprocess.DEVNULL)
        if not listing.exists():
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
            raise SystemExit(f"error: pytest could not collect the GPU checks' tests: {' | '.join(tail)}")
        checks: dict[str, dict[str, list[str]]] = {marker: {} for marker in markers}
        for entry in json.loads(listing.read_text()):
            checks[entry["marker"]].setdefault(entry["check"], []).append(entry["nodeid"])
    return {marker: list(by_check.items()) for marker, by_check in checks.items()}


def _junit_outcomes(path: Path) -> dict[str, tuple[str, str]]:
    """node id -> (passed | failed | skipped, first line of its message) from pytest's JUnit XML."""
    outcomes = {}
    for case in ET.parse(path).iter("testcase"):
        node = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        status, message = "passed", ""
        for tag, meaning in (("failure", "failed"), ("error", "failed"), ("skipped", "skipped")):
            found = case.find(tag)
            if found is not None:
                status, message = meaning, (found.get("message") or tag).strip().splitlines()[0][:200]
                break
        outcomes[node] = (status, message)
    return outcomes


def run_pytest(checks: list[tuple[str, list[str]]], workdir: Path, *, require_all_run: bool,
               workers: int = 0, budgeted: bool = False, marker: str | None = None) -> list[Result]:
    """One pytest process for every node id (``workers`` > 0: that many pytest-xdist
    workers, so that cold compiles run side by side); one Result per check (see
    :func:`judge`). Its output is kept beside the JUnit XML. ``budgeted``: cut at
    --budget-s (its checks SKIP then), with its workers (its own process group).
    ``marker``: every test of that marker is asked for, so the command is the plain
    ``pytest -m MARKER`` (what a person reruns by hand); else the node ids."""
    nodes = ["-m", marker] if marker else [node for _, ids in checks for node in ids]
    junit = workdir / f"junit_{len(list(workdir.glob('junit_*')))}.xml"
    parallel = ["-n", str(workers)] if workers > 0 and importlib.util.find_spec("xdist") is not None else []
    timeout = _within_budget(math.inf)[0] if budgeted else None
    timeout = None if timeout == math.inf else timeout
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", *OWN_PYTEST_OPTIONS, *parallel, f"--junitxml={junit}", *nodes],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException as stopped:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        junit.with_suffix(".log").write_text(out + err + f"\n[killed: {type(stopped).__name__}]\n")
        if isinstance(stopped, subprocess.TimeoutExpired):
            return [Result(name, SKIP, f"cut by the time budget (--budget-s) after {timeout:.0f} s")
                    for name, _ in checks]
        raise
    junit.with_suffix(".log").write_text(out + err)
    if not junit.exists():  # pytest stopped before running (e.g. a node id that no longer exists)
        reason = (out + err).strip().splitlines()[-1:] or [f"pytest exit code {proc.returncode}"]
        return [Result(name, FAIL, f"pytest ran nothing: {reason[0][:200]}") for name, _ in checks]
    results = judge(checks, _junit_outcomes(junit), require_all_run=require_all_run)
    for result in results:
        result.seconds = (time.perf_counter() - started) / len(results)
    return results


def judge(checks: list[tuple[str, list[str]]], outcomes: dict[str, tuple[str, str]], *,
          require_all_run: bool) -> list[Result]:
    """A check passes when its tests ran and none failed. A skipped test makes it SKIP
    when nothing else ran, or FAIL with ``require_all_run`` (on a CUDA machine the
    CUDA tests must run); a test that did not run at all (renamed?) makes it FAIL."""
    results = []
    for name, ids in checks:
        mine = {node: outcome for node, outcome in outcomes.items()
                if any(node == i or node.startswith(i + "[") or (i.endswith(".py") and node.startswith(i + "::"))
                       for i in ids)}
        missing = [i for i in ids if not any(n == i or n.startswith(i + "[") or n.startswith(i + "::") for n in mine)]
        failed = [f"{node.split('::')[-1]}: {msg}" for node, (status, msg) in mine.items() if status == "failed"]
        skipped = [msg for status, msg in mine.values() if status == "skipped"]
        passed = sum(status == "passed" for status, _ in mine.values())
        if missing:
            results.append(Result(name, FAIL, f"did not run (renamed or removed?): {', '.join(missing)}"[:400]))
        elif failed:
            results.append(Result(name, FAIL, "; ".join(failed)[:400]))
        elif skipped and (require_all_run or not passed):
            results.append(Result(name, FAIL if require_all_run else SKIP, f"skipped: {skipped[0]}"))
        else:
            results.append(Result(name, PASS, f"{passed} test(s)"))
    return results


# -- runs of python -m dreamer ------------------------------------------------------


def _env(**extra: str) -> dict:
    env = {**os.environ, "SDL_VIDEODRIVER": "dummy", **extra}
    env.pop("HYDRA_FULL_ERROR", None)
    return env


QUIET = ("logger.progress_bar=false", "eval.video=false")


def run_overrides() -> tuple[str, ...]:
    """QUIET, and no open-loop videos where imageio-ffmpeg is missing: a lent machine may
    lack it (its wheel is large to carry), and a run that would write videos without it
    stops at its start, which would fail every run check here for want of a video."""
    try:
        import imageio_ffmpeg  # noqa: F401
    except ImportError:
        print("imageio-ffmpeg is not installed: the runs here write no videos (eval.openloop=false)", flush=True)
        return (*QUIET, "eval.openloop=false")
    return QUIET


# time.monotonic() after which nothing new starts and runs in flight are cut (--budget-s).
DEADLINE = math.inf


class OutOfBudget(Exception):
    """A run not started, or cut, because --budget-s ran out: its check is a SKIP, not a FAIL."""


def _within_budget(timeout: float) -> tuple[float, bool]:
    """(the timeout to give a run, whether the budget is what bounds it)."""
    left = DEADLINE - time.monotonic()
    if left < 20:
        raise OutOfBudget("out of the time budget (--budget-s)")
    return min(timeout, left), left < timeout


def run_dreamer(run_dir: Path, *overrides: str, timeout: float = 900, env: dict | None = None,
                launcher: tuple[str, ...] = ("-m", "dreamer"), on_start=None, summary_dir: Path | None = None) -> dict:
    """``python -m dreamer`` with ``overrides`` into ``run_dir``; returns the summary.json
    of ``summary_dir`` (a resumed run's own directory), else of ``run_dir``. Raises
    RuntimeError with the last error line when it fails; its output goes to ``run_dir``.log.
    ``on_start(proc, run_dir)`` runs in a thread while the run runs (to watch it)."""
    timeout, budget_bound = _within_budget(timeout)
    cmd = [sys.executable, *launcher, *QUIET, f"hydra.run.dir={run_dir}", *overrides]
    # Its own process group: a run cut at its timeout is killed with its workers and its
    # background-compile child, which hold the output pipes open otherwise.
    proc = subprocess.Popen(cmd, cwd=REPO, env=env or _env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL, start_new_session=True)
    # The watcher runs beside communicate(): the run's output pipes must be drained meanwhile.
    watcher = threading.Thread(target=on_start, args=(proc, run_dir), daemon=True) if on_start else None
    try:
        if watcher is not None:
            watcher.start()
        out, err = proc.communicate(timeout=timeout)
    except BaseException as stopped:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        (run_dir.parent / f"{run_dir.name}.log").write_text(out + err + f"\n[killed: {type(stopped).__name__}]\n")
        if isinstance(stopped, subprocess.TimeoutExpired) and budget_bound:
            quiet = time.time() - _last_write(run_dir)
            if quiet > HUNG_AFTER_S:  # a hung run is a failure, whatever the budget
                raise RuntimeError(f"hung: its run directory unchanged for {quiet:.0f} s when the budget "
                                   f"cut it") from None
            raise OutOfBudget(f"cut by the time budget (--budget-s) after {timeout:.0f} s") from None
        raise
    finally:
        if watcher is not None:
            watcher.join(timeout=10)
    (run_dir.parent / f"{run_dir.name}.log").write_text(out + err)
    if proc.returncode != 0:
        last = [line for line in err.splitlines() if line.strip()][-1:] or [f"exit code {proc.returncode}"]
        raise RuntimeError(f"exit {proc.returncode}: {last[0][:300]}")
    summary = (summary_dir or run_dir) / "summary.json"
    return json.loads(summary.read_text()) if summary.exists() else {}


# A run whose directory changed within this many seconds before a budget cut was working
# (a cold compile writes nothing for up to a few minutes); older: it hung.
HUNG_AFTER_S = 300.0


def _last_write(run_dir: Path) -> float:
    """The newest modification time under ``run_dir`` (0 when it holds nothing)."""
    times = [p.stat().st_mtime for p in [run_dir, *run_dir.rglob("*")] if p.exists()]
    return max(times, default=0.0)


def _log_text(run_dir: Path) -> str:
    path = run_dir.parent / f"{run_dir.name}.log"
    return path.read_text() if path.exists() else ""


def _gpu_mappings(pid: int) -> dict[str, int]:
    """The NVIDIA device files the process maps, with the bytes mapped from each
    (/proc/PID/maps). Initialising the driver alone (``torch.cuda.is_available()``
    calls cuInit) may map some; a CUDA context maps far more (its memory windows)."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return {}
    mapped: dict[str, int] = {}
    for line in maps.splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[5].startswith("/dev/nvidia"):
            start, end = (int(x, 16) for x in parts[0].split("-"))
            mapped[parts[5]] = mapped.get(parts[5], 0) + end - start
    return mapped


def _gpu_memory_by_pid() -> dict[int, int] | None:
    """MiB of GPU memory per process holding a CUDA context (nvidia-smi's compute
    apps); None where nvidia-smi cannot say (absent, or a container showing the
    host's pids, which the caller notices: the learner is not listed)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    found = {}
    for line in out.stdout.splitlines():
        pid, _, mib = line.partition(",")
        if pid.strip().isdigit():  # under MIG the memory reads [N/A]: still a context (-1)
            found[int(pid)] = int(mib) if mib.strip().isdigit() else -1
    return found


def judge_contexts(learner: int, workers: list[int], maps: dict[int, dict[str, int]],
                   gpu_mib: dict[int, int] | None) -> tuple[str, str]:
    """(PASS when only the learner holds a CUDA context, the evidence). nvidia-smi's
    per-process GPU memory decides when it lists the learner (its pids are ours).
    Without that the mappings cannot tell: a worker that only initialised the driver
    (torchrl's collector calls ``torch.cuda.is_available()`` in each) maps
    /dev/nvidiaN too, so the check is a SKIP with the mappings as its evidence."""
    mapped = {("learner" if p == learner else p): {f: round(b / 2**20, 1) for f, b in maps.get(p, {}).items()}
              for p in [learner, *workers]}
    if not workers:
        return FAIL, "no collector worker found"
    if gpu_mib is None or learner not in gpu_mib:
        return SKIP, f"nvidia-smi does not list the learner: no per-process GPU memory; MiB mapped: {mapped}"
    holding = {p: gpu_mib[p] for p in workers if p in gpu_mib}
    evidence = (f"{len(workers)} worker(s), {len(holding)} holding a context (nvidia-smi: learner "
                f"{gpu_mib[learner]} MiB, workers {holding}); MiB mapped: {mapped}")
    return (FAIL if holding else PASS), evidence


def _spawned_children(pid: int) -> list[int]:
    import psutil

    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if any("spawn_main" in part for part in child.cmdline()):
                found.append(child.pid)
        except psutil.Error:
            pass
    return found


# -- the GPU checks ------------------------------------------------------------------


def check_page_locked_replay(workdir: Path) -> Result:
    """In a fresh process: allocate a page-locked replay storage of ~2.2 GiB (the
    caching host allocator would round it to 4 GiB) and compare resident growth."""
    code = r"""
import json, psutil, torch
from tensordict import TensorDict
from torchrl_ext import PinnedLazyTensorStorage
torch.cuda.init()
step = TensorDict({"pixels": torch.zeros(64, 64, 3, dtype=torch.uint8), "reward": torch.zeros(1)}, [])
capacity = 180_000
before = psutil.Process().memory_info().rss
storage = PinnedLazyTensorStorage(capacity, pin_memory=True)
storage.set(slice(0, 1), step.unsqueeze(0))
after = psutil.Process().memory_info().rss
leaves = list(storage._storage.values(True, True))
print(json.dumps({"exact": sum(t.numel() * t.element_size() for t in leaves), "grown": after - before,
                  "pinned": all(t.is_pinned() for t in leaves)}))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, env=_env(),
                          timeout=_within_budget(600)[0])
    if proc.returncode != 0:
        return Result(PAGE_LOCKED, FAIL, proc.stderr.strip().splitlines()[-1][:300])
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    exact, grown = got["exact"], got["grown"]
    rounded = 2 ** math.ceil(math.log2(exact))
    detail = (f"replay {exact / 2**30:.2f} GiB, resident growth {grown / 2**30:.2f} GiB, power-of-two rounding "
              f"would lock {rounded / 2**30:.2f} GiB; pinned={got['pinned']}")
    ok = got["pinned"] and exact * 0.95 <= grown <= exact + 0.25 * (rounded - exact)
    return Result(PAGE_LOCKED, PASS if ok else FAIL, detail)


def check_smoke_runs(workdir: Path, results: dict, quick: bool = False) -> list[Result]:
    """The smoke matrix on CUDA (``quick``: its two corners, eager fp32 and compiled
    autocast); the first run also checks the workers' CUDA contexts and leaves a run
    directory for the resume checks."""
    out = []
    contexts: dict = {}

    def watch_contexts(proc, run_dir):
        # Once it learns (workers long started), look at every process of the run.
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline:
            metrics = run_dir / "metrics.jsonl"
            if metrics.exists() and "updates" in metrics.read_text():
                workers = _spawned_children(proc.pid)
                contexts.update(learner=proc.pid, workers=workers, gpu_mib=_gpu_memory_by_pid(),
                                maps={p: _gpu_mappings(p) for p in [proc.pid, *workers]})
                return
            time.sleep(0.5)

    rates: dict = {}
    cut: list[str] = []  # runs the budget stopped (not failures)
    first_dir = None
    matrix = [("off", "off"), ("on", "auto")] if quick else \
        [(c, a) for c in ("off", "on") for a in ("off", "auto")]
    for compile_choice, autocast in matrix:
        name = f"compile={compile_choice} autocast={autocast}"
        run_dir = workdir / f"smoke_compile-{compile_choice}_autocast-{autocast}"
        overrides = ("experiment=smoke", "device=cuda", "collector.num_workers=2", f"compile={compile_choice}",
                     f"autocast={autocast}", "train.total_frames=1000", "logger.log_every=20")
        try:
            summary = run_dreamer(run_dir, *overrides, on_start=watch_contexts if first_dir is None else None)
        except OutOfBudget as err:
            rates[name] = str(err)
            cut.append(name)
            continue
        except (RuntimeError, subprocess.TimeoutExpired) as err:
            rates[name] = f"failed: {err}"
            continue
        if first_dir is None:
            first_dir = run_dir
        rates[name] = round(summary.get("updates_per_s") or 0, 2)
    results["smoke_updates_per_s"] = rates
    results["smoke_run_dir"] = str(first_dir) if first_dir else None
    if contexts:
        status, evidence = judge_contexts(contexts["learner"], contexts["workers"], contexts["maps"],
                                          contexts["gpu_mib"])
        out.append(Result(SMOKE_CONTEXTS, status, evidence))
    elif len(cut) == len(matrix):
        out.append(Result(SMOKE_CONTEXTS, SKIP, "every smoke run was cut by the time budget (--budget-s)"))
    else:
        out.append(Result(SMOKE_CONTEXTS, FAIL, "the run never reached its first logged update"))
    failed = [k for k in rates if k not in cut and isinstance(rates[k], str)]
    status = FAIL if failed else SKIP if len(cut) == len(matrix) else PASS
    out.append(Result(SMOKE_RATES, status, "; ".join(f"{k}: {v}" for k, v in rates.items())))
    return out


def check_v3_pixels(workdir: Path, results: dict) -> Result:
    # The learner's figures hardly depend on the task: Pendulum's pixels stand in
    # where dm_control is not installed (a GPU box with only the core packages).
    has_dmc = importlib.util.find_spec("dm_control") is not None
    env = () if has_dmc else ("env=pendulum_pixels", "env.name=Pendulum-v1")
    run_dir = workdir / ("dmc_vision_v3_size12m" if has_dmc else "pendulum_pixels_size12m")
    peak_rss = {"bytes": 0}

    def watch_rss(proc, _run_dir):
        import psutil

        learner = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                peak_rss["bytes"] = max(peak_rss["bytes"], learner.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(1.0)

    try:
        # 1100 random agent steps fill more than one 16 x 64 batch; 0.5 updates per
        # agent step after that: about 200 updates by 1500 agent steps (3000 frames).
        summary = run_dreamer(run_dir, "experiment=dmc_vision_v3", "model=size12m", *env, "device=cuda",
                              "collector.num_workers=4", "collector.init_random_frames=1100",
                              "train.total_frames=3000", "eval.every=100000", "eval.episodes=1",
                              "checkpoint.every=100000", on_start=watch_rss, timeout=1500)
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        return Result(V3_PIXELS, FAIL, str(err))
    match = re.search(r"replay: (\d+) steps x (\d+) bytes = ([\d.]+) GiB of host memory, (\S+)", _log_text(run_dir))
    if match is None:
        return Result(V3_PIXELS, FAIL, "no 'replay: ...' line in the run's log")
    replay_bytes = int(match.group(1)) * int(match.group(2))
    figures = {"env": "dmc walker-walk" if has_dmc else "Pendulum-v1 pixels",
               "updates": summary.get("updates"), "updates_per_s": summary.get("updates_per_s"),
               "frames_per_s": summary.get("frames_per_s"),
               "first_update_s": summary.get("first_update_s"), "random_phase_s": summary.get("random_phase_s"),
               # compile.background (the preset's default): a child compiles on the GPU while updates run eager.
               "compile_background_s": summary.get("compile_background_s"),
               "compiled_from_update": summary.get("compiled_from_update"),
               "compile_switch_s": summary.get("compile_switch_s"),
               # Graphs the run compiled again at the switch instead of reading the child's (should be 0).
               "compile_switch_cache_misses": summary.get("compile_switch_cache_misses"),
               "replay_gib": round(replay_bytes / 2**30, 2), "replay_memory": match.group(4),
               "peak_rss_gib": round(peak_rss["bytes"] / 2**30, 2)}
    results["v3_pixels_size12m"] = figures
    # Page-locked storage is resident from its first write on (locking faults every page in).
    compile_failed = "background compile failed" in _log_text(run_dir)
    figures["background_compile_failed"] = compile_failed
    ok = (summary.get("updates") or 0) >= 100 and match.group(4) == "page-locked" and \
        peak_rss["bytes"] >= 0.95 * replay_bytes and not compile_failed
    return Result(V3_PIXELS, PASS if ok else FAIL, str(figures))


def check_profiled_window(workdir: Path) -> Result:
    run_dir = workdir / "smoke_profiled"
    traces = workdir / "traces"
    try:
        run_dreamer(run_dir, "experiment=smoke", "device=cuda", "collector.num_workers=2", "compile=off",
                    "train.total_frames=800", "logger.log_every=1000", "eval.every=100000",
                    "checkpoint.every=100000", "collector.weight_sync_every=4",
                    env=_env(PROF_ENABLED="1", PROF_ITERATIONS="30-40", PROF_OUTPUT_DIR=str(traces)))
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        return Result(PROFILED, FAIL, str(err))
    trace = traces / "learner_trace.json"
    if not trace.exists():
        return Result(PROFILED, FAIL, "no learner trace written")
    ranges, runtime, copies = [], [], []
    for event in iter_events(trace):
        if event.get("ph") != "X":
            continue
        name, cat = event.get("name", ""), event.get("cat", "")
        span = (event["pid"], event["tid"], float(event["ts"]), float(event["ts"]) + float(event.get("dur", 0)))
        if re.fullmatch(r"## train/.+ ##", name):
            ranges.append(span)
        elif cat == "cuda_runtime":
            runtime.append((name, span, (event.get("args") or {}).get("correlation")))
        elif cat == "gpu_memcpy" and "DtoH" in name:
            copies.append((event.get("args") or {}).get("correlation"))

    def inside(span):
        return any(span[0] == r[0] and span[1] == r[1] and r[2] <= span[2] <= r[3] for r in ranges)

    dtoh = set(copies)
    # A host wait shows as a runtime call (.item() on a CUDA tensor: cudaMemcpyAsync, then
    # cudaStreamSynchronize); a plain cudaMemcpy waits too. CPU ops (the sampler's index
    # arithmetic) are no sync and are not counted.
    syncs = [name for name, span, _ in runtime
             if inside(span) and (name.endswith("Synchronize") or name == "cudaMemcpy")]
    dtoh_inside = [name for name, span, corr in runtime if inside(span) and corr in dtoh]
    if not ranges:
        return Result(PROFILED, FAIL, "no '## train/... ##' range in the trace")
    ok = not syncs and not dtoh_inside
    return Result(PROFILED, PASS if ok else FAIL,
                  f"{len(ranges)} update ranges; {len(syncs)} sync call(s) {sorted(set(syncs))[:4]}, "
                  f"{len(dtoh_inside)} device-to-host copies inside them")


def check_resume(workdir: Path, smoke_dir: str | None) -> Result:
    # A resume names no experiment: the run keeps its saved config, and an experiment's
    # keys (compile, autocast) would be refused overrides.
    if smoke_dir is None:
        return Result(RESUME, FAIL, "no finished smoke run on CUDA to resume")
    run_dir = Path(smoke_dir)
    try:
        on_gpu = run_dreamer(workdir / "resume_gpu", f"resume={run_dir}",
                             "train.total_frames=1300", "device=cuda", summary_dir=run_dir)
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        return Result(RESUME, FAIL, f"on the GPU: {err}")
    if on_gpu.get("frames", 0) < 1300:
        return Result(RESUME, FAIL, f"frames after the GPU resume {on_gpu.get('frames')}")
    try:
        on_cpu = run_dreamer(workdir / "resume_cpu", f"resume={run_dir}",
                             "train.total_frames=1500", "device=cpu", "collector.num_workers=1", summary_dir=run_dir)
    except OutOfBudget as err:
        return Result(RESUME, SKIP, f"the GPU resume passed (frames {on_gpu.get('frames')}); the CPU resume: {err}")
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        return Result(RESUME, FAIL, f"on the CPU: {err}")
    ok = on_cpu.get("frames", 0) >= 1500
    return Result(RESUME, PASS if ok else FAIL,
                  f"frames after the GPU resume {on_gpu.get('frames')}, after the CPU resume {on_cpu.get('frames')}")


def check_fewer_gpus(workdir: Path, gpus: int) -> Result:
    if gpus < 2:
        return Result(FEWER_GPUS, SKIP, f"needs 2 GPUs, {gpus} visible")
    run_dir = workdir / "smoke_2gpus"
    try:
        run_dreamer(run_dir, "experiment=smoke", "device=cuda", "compile=off", "train.total_frames=600",
                    env=_env(CUDA_VISIBLE_DEVICES="0,1"))
        resumed = run_dreamer(workdir / "resume_1gpu", f"resume={run_dir}",
                              "train.total_frames=900", "device=cuda", env=_env(CUDA_VISIBLE_DEVICES="0"),
                              summary_dir=run_dir)
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        return Result(FEWER_GPUS, FAIL, str(err))
    ok = resumed.get("frames", 0) >= 900
    return Result(FEWER_GPUS, PASS if ok else FAIL, f"frames after the resume {resumed.get('frames')}")


def check_torchrun(workdir: Path, gpus: int, results: dict) -> Result:
    if gpus < 2:
        return Result(TORCHRUN, SKIP, f"needs 2 GPUs, {gpus} visible")
    common = ("experiment=smoke", "device=cuda", "compile=off", "train.total_frames=1000")
    try:
        two = run_dreamer(workdir / "torchrun_2gpus", *common, env=_env(CUDA_VISIBLE_DEVICES="0,1"),
                          launcher=("-m", "torch.distributed.run", "--nproc_per_node=2", "-m", "dreamer"))
        one = run_dreamer(workdir / "torchrun_1gpu", *common, env=_env(CUDA_VISIBLE_DEVICES="0"))
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        return Result(TORCHRUN, FAIL, str(err))
    divergence = two.get("max_param_divergence")
    results["torchrun"] = {"updates_per_s_2gpus": two.get("updates_per_s"),
                           "updates_per_s_1gpu": one.get("updates_per_s"), "max_param_divergence": divergence}
    return Result(TORCHRUN, PASS if divergence == 0 else FAIL, str(results["torchrun"]))


# -- main ----------------------------------------------------------------------------


class Selection:
    """The checks ``--only TEXT ...`` names: those whose names hold one of the texts (any case);
    every check when no text is given. A text that names no check is a usage error (exit 2)."""

    NOT_SELECTED = "not selected (--only)"

    def __init__(self, texts: list[str] | None, names: list[str]):
        self.texts = [t.lower() for t in texts or []]
        if unknown := [t for t in texts or [] if not any(t.lower() in name.lower() for name in names)]:
            print(f"error: --only {unknown[0]!r} names no check; the checks: {'; '.join(names)}", file=sys.stderr)
            raise SystemExit(2)

    def __call__(self, name: str) -> bool:
        return not self.texts or any(t in name.lower() for t in self.texts)

    def run(self, checks: list[tuple[str, list[str]]], run) -> list[Result]:
        """``run`` on the selected checks; the others SKIP; the results in ``checks``' order."""
        chosen = [check for check in checks if self(check[0])]
        ran = {result.check: result for result in (run(chosen) if chosen else [])}
        return [ran.get(name) or Result(name, SKIP, self.NOT_SELECTED) for name, _ in checks]


def _whole_marker(chosen: list, every: list, marker: str) -> str | None:
    """``marker`` where every check of it is chosen (plain ``pytest -m marker``), else None."""
    return marker if len(chosen) == len(every) else None


def cuda_state() -> tuple[int, str]:
    """(visible GPUs, why none when 0)."""
    import torch

    if torch.version.cuda is None:
        return 0, f"torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available():
        return 0, "no CUDA device is visible"
    return torch.cuda.device_count(), ""


def main(argv: list[str] | None = None) -> int:
    global DEADLINE, QUIET
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write the results here (rewritten after every check)")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--cpu-only", action="store_true", help="run the CPU-provable subset only")
    only.add_argument("--gpu-only", action="store_true",
                      help="skip the CPU-provable subset (CI runs it): for a GPU lent for minutes")
    parser.add_argument("--quick", action="store_true",
                        help="the smoke matrix's two corners only (eager fp32, compiled autocast)")
    parser.add_argument("--budget-s", type=float, default=math.inf,
                        help="start no check after this many seconds and cut the runs in flight at it")
    parser.add_argument("--pytest-workers", type=int, default=0,
                        help="run the CUDA tests on this many pytest-xdist workers (their cold compiles side by side)")
    parser.add_argument("--only", nargs="+", metavar="TEXT",
                        help="run only the checks whose names contain one of these texts (case-insensitive); "
                             "the others are listed as SKIP")
    parser.add_argument("--keep", type=Path,
                        help="keep the runs' directories under DIR/<date-time> (default: a temporary directory)")
    args = parser.parse_args(argv)
    DEADLINE = time.monotonic() + args.budget_s

    gpus, why_not = cuda_state()
    import torch

    if gpus and not args.cpu_only:
        QUIET = run_overrides()

    machine = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpus": gpus,
               "gpu_name": torch.cuda.get_device_name(0) if gpus else None}
    if not gpus:
        print(f"no CUDA here ({why_not}): running the CPU-provable subset; the GPU checks are skipped", flush=True)
    elif args.cpu_only:
        print(f"{gpus} GPU(s) ({machine['gpu_name']}), --cpu-only: running the CPU-provable subset", flush=True)
    else:
        print(f"{gpus} GPU(s): {machine['gpu_name']}, torch {torch.__version__}, CUDA {torch.version.cuda}", flush=True)

    results: list[Result] = []
    figures: dict = {}
    checks: dict = {}  # which checks exist, by kind: the report lists them whatever ran

    def report(*produced: Result) -> None:
        for result in produced:
            results.append(result)
            _print(result)
        if args.json:  # after every check: a run cut short still leaves what it found
            counts = {s: sum(r.status == s for r in results) for s in (PASS, FAIL, SKIP)}
            args.json.write_text(json.dumps({"machine": machine, "results": [asdict(r) for r in results],
                                             "figures": figures, "counts": counts, "checks": checks}, indent=2))

    workdir_context = tempfile.TemporaryDirectory(prefix="gpu_check_") if args.keep is None else None
    # A fresh directory per invocation: a run refuses a directory holding another run's checkpoints.
    workdir = Path(workdir_context.name) if workdir_context else args.keep / time.strftime("%Y%m%d-%H%M%S")
    workdir.mkdir(parents=True, exist_ok=True)
    collected = collect_checks()
    checks.update({marker: [name for name, _ in found] for marker, found in collected.items()}, run=GPU_RUN_CHECKS)
    cpu_checks, cuda_tests = collected["gpu_acceptance"], collected["cuda"]
    selected = Selection(args.only, [name for name, _ in cpu_checks + cuda_tests] + GPU_RUN_CHECKS)
    try:
        if args.gpu_only and gpus:
            report(*(Result(name, SKIP, "--gpu-only (CI runs the CPU-provable subset)") for name, _ in cpu_checks))
        else:
            report(*selected.run(cpu_checks, lambda chosen: run_pytest(
                chosen, workdir, require_all_run=False, marker=_whole_marker(chosen, cpu_checks, "gpu_acceptance"))))
        gpu_checks = [name for name, _ in cuda_tests] + GPU_RUN_CHECKS
        if not gpus or args.cpu_only:
            reason = why_not if not gpus else "--cpu-only"
            report(*(Result(name, SKIP, reason) for name in gpu_checks))
        else:
            try:
                report(*selected.run(cuda_tests, lambda chosen: run_pytest(
                    chosen, workdir, require_all_run=True, workers=args.pytest_workers, budgeted=True,
                    marker=_whole_marker(chosen, cuda_tests, "cuda"))))
            except OutOfBudget as cut:
                report(*(Result(name, SKIP, str(cut)) for name, _ in cuda_tests))
            steps = [  # (the checks a step reports, the step), in GPU_RUN_CHECKS' order
                ([PAGE_LOCKED], lambda: [check_page_locked_replay(workdir)]),
                ([SMOKE_CONTEXTS, SMOKE_RATES], lambda: check_smoke_runs(workdir, figures, quick=args.quick)),
                ([PROFILED], lambda: [check_profiled_window(workdir)]),
                ([RESUME], lambda: [check_resume(workdir, figures.get("smoke_run_dir"))]),
                ([V3_PIXELS], lambda: [check_v3_pixels(workdir, figures)]),
                ([FEWER_GPUS], lambda: [check_fewer_gpus(workdir, gpus)]),
                ([TORCHRUN], lambda: [check_torchrun(workdir, gpus, figures)]),
            ]
            assert [name for names, _ in steps for name in names] == GPU_RUN_CHECKS
            for names, step in steps:
                if not any(selected(name) for name in names):
                    report(*(Result(name, SKIP, selected.NOT_SELECTED) for name in names))
                    continue
                if DEADLINE - time.monotonic() < 30:
                    report(*(Result(name, SKIP, "out of the time budget (--budget-s)") for name in names))
                    continue
                started = time.perf_counter()
                try:
                    produced = step()
                except OutOfBudget as cut:
                    produced = [Result(name, SKIP, str(cut)) for name in names]
                except Exception as err:  # noqa: BLE001 -- one check's crash is its FAIL line, not the script's
                    produced = [Result(names[0], FAIL, f"{type(err).__name__}: {err}"[:400])]
                for result in produced:
                    result.seconds = time.perf_counter() - started
                report(*produced)
    finally:
        if workdir_context is not None:
            workdir_context.cleanup()
    counts = {s: sum(r.status == s for r in results) for s in (PASS, FAIL, SKIP)}
    print(f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped", flush=True)
    return 1 if counts[FAIL] else 0


if __name__ == "__main__":
    sys.exit(main())

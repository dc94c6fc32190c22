"""Helpers for end-to-end tests that run `python -m dreamer` and inject faults into it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import psutil

from tests.support.forkserver import ForkedRun, ForkServer
from tests.support.paths import REPO_ROOT as ROOT

# Small and eager: these tests are about processes and files, not learning. Collected in
# the learner's process on one thread (a worker's start-up costs as much CPU as the
# learner's own; two OpenMP threads on a busy 2-core box slow tiny updates many times),
# with one update per four agent steps (the smoke's 4 x 10 batches).
FAST_TRAIN_RATIO = 10
FAST = ("experiment=smoke", "compile=off", "eval.video=false", "logger.progress_bar=false",
        "collector.num_workers=0", "threads=1", f"train.train_ratio={FAST_TRAIN_RATIO}")
# As FAST from Pendulum's state vector: no rendering and no convolutions, about half a FAST
# run's CPU. For tests whose subject does not depend on what is observed; FAST keeps the
# smoke's pixels for those that need megabytes of replay (checkpoints caught mid-write, a
# file-size limit) or a slow evaluation.
FAST_STATES = (*FAST, "env=pendulum")
# As FAST_STATES, with one collector worker process: for tests about workers. A later
# env=... override replaces the pendulum (Hydra: the last override of a group wins).
FAST_WITH_WORKER = (*FAST_STATES, "collector.num_workers=1")


def dreamer_env() -> dict:
    env = {**os.environ, "SDL_VIDEODRIVER": "dummy"}
    env.pop("HYDRA_FULL_ERROR", None)
    return env


_fork_server: ForkServer | None = None


def _forked(overrides: tuple[str, ...], env: dict, fresh: bool) -> ForkServer | None:
    """The fork server to start this run from (tests/support/forkserver.py), or None for a
    fresh interpreter: asked for, DREAMER_TESTS_EXEC=1, --verbose (it changes what the
    libraries are imported with), or an environment the server was not started with."""
    global _fork_server
    if fresh or os.environ.get("DREAMER_TESTS_EXEC") == "1" or "--verbose" in overrides:
        return None
    if _fork_server is None:
        _fork_server = ForkServer(env, ROOT)
    return _fork_server if _fork_server.serves(env, ROOT) else None


def run_dreamer(*overrides: str, timeout: float = 600, fresh: bool = False,
                env: dict | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`python -m dreamer OVERRIDES` run to its end, its output captured. ``fresh``: in a new
    interpreter (for tests of what a run prints while its libraries import); ``env``: its
    environment (default: dreamer_env()); ``cwd``: its working directory (elsewhere than the
    checkout: a new interpreter)."""
    env = dreamer_env() if env is None else env
    server = _forked(overrides, env, fresh or Path(cwd) != ROOT)
    if server is None:
        return subprocess.run(
            [sys.executable, "-m", "dreamer", *overrides],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
            stdin=subprocess.DEVNULL,  # a prompt (e.g. a W&B login) must fail, not hang
        )
    run = server.start(list(overrides), env, new_session=False)
    try:
        out, err = run.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        run.kill()
        run.wait()
        raise
    return subprocess.CompletedProcess(run.args, run.returncode, out, err)


def run_dreamer_into_log(args: list[str], log_path: Path, timeout_s: float) -> int:
    """What scripts that start runs (learning_check.py's ``run_python``) do, for their tests:
    ``python -m dreamer`` run to its end (forked as run_dreamer forks), its output (stdout,
    then stderr) written to ``log_path``; its exit status, -9 past ``timeout_s``."""
    assert args[:2] == ["-m", "dreamer"], args
    try:
        done = run_dreamer(*args[2:], timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return -9
    log_path.write_text(done.stdout + done.stderr)
    return done.returncode


def start(*overrides: str, fresh: bool = False, **popen) -> subprocess.Popen | ForkedRun:
    """`python -m dreamer OVERRIDES` in its own process group (as a shell job would be);
    ``fresh`` as for run_dreamer. Popen arguments (``preexec_fn``...) start a fresh interpreter."""
    env = dreamer_env()
    server = _forked(overrides, env, fresh or bool(popen))
    if server is not None:
        return server.start(list(overrides), env, new_session=True)
    return subprocess.Popen(
        [sys.executable, "-m", "dreamer", *overrides], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
        start_new_session=True, **popen,
    )


def wait_for(condition: Callable[[], bool], timeout: float, what: str, poll: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(poll)


def descendants(pid: int) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def worker_pids(pid: int) -> list[int]:
    """The collector worker processes (multiprocessing spawn children, not the resource tracker)."""
    found = []
    for p in psutil.Process(pid).children():
        try:
            if any("spawn_main" in part for part in p.cmdline()):
                found.append(p.pid)
        except psutil.Error:
            pass
    return found


def alive(pids: list[int]) -> list[int]:
    """PIDs still running (a zombie counts as gone: it holds no resources but its entry)."""
    running = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                running.append(pid)
        except psutil.NoSuchProcess:
            pass
    return running


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def has_updates(run_dir: Path) -> Callable[[], bool]:
    """True once the run logged a metrics line with updates (it is past start-up and learning)."""
    def check() -> bool:
        try:
            return any("loss_model_kl" in line for line in (run_dir / "metrics.jsonl").read_text().splitlines())
        except FileNotFoundError:
            return False
    return check

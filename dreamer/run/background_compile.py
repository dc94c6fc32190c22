"""Compile the learner's losses in another process while updates run eager.

A cold ``torch.compile`` of the actor and value losses takes minutes on a small
CPU (a V3 imagination unrolls 15 steps into one graph). Blocking on it delays the
first update by as long. With ``compile.background=true`` the trainer instead
starts learning with the eager losses at once, and after the first update
(whose memory sizes it: a child that would not fit is not started, the run says
so and stays eager) a spawned child process builds the same learner from the
same config, compiles and warms it on a real replay batch. Everything it
compiles lands in inductor's on-disk caches (FX graphs, AOTAutograd:
``TORCHINDUCTOR_CACHE_DIR``, inherited); when the child exits, the trainer swaps
in the compiled losses and the next update compiles warm: dynamo traces again,
code generation and the C++ compiler are cache hits.

A child that overruns ``compile.background_timeout_minutes`` (hung) is stopped and the
run stays eager with all its threads; a child told to stop (SIGTERM: the run ended
first, or the scheduler ends the job) ends at once.

No state crosses back: the child's weights are its own throwaway copy, so its
warm-up cannot touch the run's weights, optimiser moments, return statistics
or RNG streams. The update at which compiled code takes over depends on timing;
``compile.background=false`` compiles before the first update instead (the
same update sequence every time, as exact-repeat comparisons need).
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

import psutil
import torch

from dreamer.config import CompileConfig
from dreamer.system.distributed import Ranks
from dreamer.system.memory import host_memory_available, memory_available

log = logging.getLogger("dreamer")

RESULT_NAME = ".background_compile.json"


def exit_when_orphaned(poll_s: float = 1.0) -> threading.Thread:
    """End this (spawned) process once its parent is gone. A parent killed with
    SIGKILL (the OOM killer, ``kill -9``) runs no cleanup, and the compile child
    would otherwise compile on for minutes and write into the dead run's directory.
    The parent is the one multiprocessing recorded at spawn (a parent killed while
    this child still unpickled its arguments is noticed too), else ``getppid()``."""
    spawner = mp.parent_process()
    parent = spawner.pid if spawner is not None else os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    watcher = threading.Thread(target=watch, name="exit-when-orphaned", daemon=True)
    watcher.start()
    return watcher


def compile_and_warm_up(cfg, device: str, autocast_dtype, batch) -> float:
    """The child's work: the run's learner, rebuilt from ``cfg``, compiled and warmed on
    ``batch``; returns the warm-up's seconds."""
    from dreamer.algos.registry import algorithm
    from dreamer.envs.factory import close_env, make_env

    build_models, learner_cls = algorithm(cfg.algo.name)
    env = make_env(cfg.env, cfg.algo, seed=cfg.seed)
    try:
        models = build_models(cfg.algo, cfg.env, env, torch.device(device))
    finally:
        close_env(env)
    learner = learner_cls(
        cfg.algo, cfg.compile, models, torch.device(device),
        batch_size=cfg.buffer.batch_size, batch_length=cfg.buffer.batch_length, autocast_dtype=autocast_dtype,
    )
    learner.compile()
    return learner.warmup(batch.to(device))


def end_on_sigterm() -> None:
    """SIGTERM (the trainer's cancel, or a scheduler ending the job) ends this process at once,
    with the compile workers it started; the other stop signals stay ignored (a Ctrl-C reaches
    the whole process group, and the trainer decides when its child ends)."""
    from dreamer.run.stopping import ignore_stop_signals, kill_children

    def end(signum, frame) -> None:
        kill_children()
        os._exit(128 + signum)

    ignore_stop_signals()
    signal.signal(signal.SIGTERM, end)


def _compile_child(cfg, device: str, autocast_dtype, batch, result_path: str, threads: int,
                   work: Callable = compile_and_warm_up) -> None:
    """Runs in the child: ``work`` (compile and warm up), its seconds or its error written to ``result_path``."""
    from dreamer.report.console import VERBOSE_ENV, quiet_worker

    end_on_sigterm()
    exit_when_orphaned()
    if os.environ.get(VERBOSE_ENV) != "1":
        quiet_worker()
    result: dict = {}
    try:
        torch.set_num_threads(threads)
        result["seconds"] = work(cfg, device, autocast_dtype, batch)
    except BaseException as err:  # reported to the parent, which keeps learning eager
        result["error"] = "".join(traceback.format_exception_only(type(err), err)).strip()
    Path(result_path).write_text(json.dumps(result))


# What a compile child holds besides the update its warm-up repeats: a second
# torch interpreter, the models, dynamo/inductor and the C++ compiler it runs.
# About twice what `experiment=small`'s child takes from a cold inductor cache
# (docs/PERFORMANCE.md), for larger models' graphs and kernels.
CHILD_BASE_BYTES = 2 * 2**30
# A CUDA context of its own on the learner's GPU.
CUDA_CONTEXT_BYTES = 2**30


def too_little_memory_for_child(update_bytes: int, device: torch.device) -> str | None:
    """None when a compile child fits beside this run; else why not, in one line.

    The child's warm-up runs one update (world model, actor and value, forward
    and backward) on its own copy of the models, so it needs what this process's
    first update took (``update_bytes``) again, on the learner's device, beside
    this process, which keeps its own peak (the malloc policy retains it).
    """
    gib = 2**30
    update = f"one update took {update_bytes / gib:.1f} GiB here"
    if device.type == "cuda":
        needs = [(update_bytes + CUDA_CONTEXT_BYTES, f"{update}, plus a CUDA context", memory_available(device)),
                 (CHILD_BASE_BYTES, "host memory for its interpreter and compiler", host_memory_available())]
    else:
        needs = [(update_bytes + CHILD_BASE_BYTES, f"{update}, plus its interpreter and compiler",
                  host_memory_available())]
    for need, what, (available, limited_by) in needs:
        if need > available:
            return (f"not compiling in the background: the compile process needs about {need / gib:.1f} GiB "
                    f"({what}) and {limited_by} leaves {available / gib:.1f} GiB; the losses stay eager "
                    f"(compile=off skips this check; a smaller model=size*, buffer.batch_size or more memory "
                    f"would compile)")
    return None


def compiles_in_background(compile_cfg: CompileConfig, ranks: Ranks) -> bool:
    """compile.background on a single-process run (ranks compile first, together) whose
    update path compiles (``compile_cfg``: the learner's; CUDA's auto captures the eager body)."""
    return compile_cfg.enabled and compile_cfg.background and not ranks.enabled


# Seconds a cancelled child gets to end on SIGTERM before it is killed.
CANCEL_GRACE_S = 5.0


class BackgroundCompile:
    """A child process filling the compile caches; ``poll()`` says when it is done."""

    def __init__(self, cfg, device: torch.device, autocast_dtype, batch, run_dir: Path, *, threads: int,
                 timeout_s: float | None = None, work: Callable = compile_and_warm_up):
        """Starts the child; the caller logs it (with what sized it). ``threads``: the
        intra-op thread count the run will execute the compiled losses with.
        Inductor's CPU kernels specialise on it and its FX-graph cache key holds
        it, so a child compiling at another count writes entries the run never
        reads, and the run compiles everything again at the switch. ``timeout_s``:
        a child still running after this long is stopped (poll reports it as failed).
        ``work``: what the child runs (a picklable function; tests inject one)."""
        self.result_path = Path(run_dir) / RESULT_NAME
        self.result_path.unlink(missing_ok=True)
        self.started = time.perf_counter()
        self.timeout_s = timeout_s
        # Spawned: a fresh interpreter with no dynamo state, as the collectors are.
        self.process = mp.get_context("spawn").Process(
            target=_compile_child, name="dreamer-compile",
            args=(cfg, str(device), autocast_dtype, batch.cpu(), str(self.result_path), threads, work),
            daemon=True,
        )
        self.process.start()

    def poll(self) -> dict | None:
        """None while the child runs; then its result: ``seconds`` (its warm-up) or ``error``
        (its failure, or that it overran ``timeout_s`` and was stopped)."""
        if self.process.exitcode is None:
            elapsed = time.perf_counter() - self.started
            if self.timeout_s is None or elapsed < self.timeout_s:
                return None
            self.cancel()
            limit = f"{self.timeout_s / 60:g} minutes" if self.timeout_s >= 60 else f"{self.timeout_s:g} s"
            return {"error": f"the compile process did not finish within {limit} "
                             "(compile.background_timeout_minutes) and was stopped", "wall_s": elapsed}
        try:
            result = json.loads(self.result_path.read_text())
        except (OSError, ValueError):
            result = {"error": f"the compile process exited with code {self.process.exitcode} and no result"}
        self.result_path.unlink(missing_ok=True)
        result["wall_s"] = time.perf_counter() - self.started
        return result

    def cancel(self) -> None:
        """Stop the child if it still runs (the run ended first, or it overran its time),
        and whatever it started (inductor's compile workers)."""
        if self.process.exitcode is None:
            try:
                helpers = psutil.Process(self.process.pid).children(recursive=True)
            except psutil.Error:
                helpers = []
            self.process.terminate()  # the child ends at once on SIGTERM (end_on_sigterm)
            self.process.join(timeout=CANCEL_GRACE_S)
            if self.process.exitcode is None:
                self.process.kill()
                self.process.join()
            for helper in helpers:
                with contextlib.suppress(psutil.Error):
                    helper.kill()
        self.result_path.unlink(missing_ok=True)

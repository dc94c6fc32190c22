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

No state crosses back: the child's weights are its own throwaway copy, so its
warm-up cannot touch the run's weights, optimiser moments, return statistics
or RNG streams. The update at which compiled code takes over depends on timing;
``compile.background=false`` compiles before the first update instead (the
same update sequence every time, as exact-repeat comparisons need).
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import threading
import time
import traceback
from pathlib import Path

import torch

from dreamer.config import Config
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


def _compile_child(cfg, device: str, autocast_dtype, batch, result_path: str, threads: int) -> None:
    """Runs in the child: the run's learner, rebuilt from ``cfg``, compiled and warmed on ``batch``."""
    from dreamer.report.console import VERBOSE_ENV, quiet_worker
    from dreamer.run.stopping import ignore_stop_signals

    ignore_stop_signals()  # the trainer owns this process's lifetime (it terminates it)
    exit_when_orphaned()
    if os.environ.get(VERBOSE_ENV) != "1":
        quiet_worker()
    result: dict = {}
    try:
        torch.set_num_threads(threads)
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
        result["seconds"] = learner.warmup(batch.to(device))
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


def compiles_in_background(cfg: Config, ranks: Ranks) -> bool:
    """compile.background on a single-process run (ranks compile first, together)."""
    return cfg.compile.enabled and cfg.compile.background and not ranks.enabled


class BackgroundCompile:
    """A child process filling the compile caches; ``poll()`` says when it is done."""

    def __init__(self, cfg, device: torch.device, autocast_dtype, batch, run_dir: Path, *, threads: int):
        """Starts the child; the caller logs it (with what sized it). ``threads``: the
        intra-op thread count the run will execute the compiled losses with.
        Inductor's CPU kernels specialise on it and its FX-graph cache key holds
        it, so a child compiling at another count writes entries the run never
        reads, and the run compiles everything again at the switch."""
        self.result_path = Path(run_dir) / RESULT_NAME
        self.result_path.unlink(missing_ok=True)
        self.started = time.perf_counter()
        # Spawned: a fresh interpreter with no dynamo state, as the collectors are.
        self.process = mp.get_context("spawn").Process(
            target=_compile_child, name="dreamer-compile",
            args=(cfg, str(device), autocast_dtype, batch.cpu(), str(self.result_path), threads),
            daemon=True,
        )
        self.process.start()

    def poll(self) -> dict | None:
        """None while the child runs; then its result: ``seconds`` (its warm-up) or ``error``."""
        if self.process.exitcode is None:
            return None
        try:
            result = json.loads(self.result_path.read_text())
        except (OSError, ValueError):
            result = {"error": f"the compile process exited with code {self.process.exitcode} and no result"}
        self.result_path.unlink(missing_ok=True)
        result["wall_s"] = time.perf_counter() - self.started
        return result

    def cancel(self) -> None:
        """Stop the child if it still runs (the run ended first)."""
        if self.process.exitcode is None:
            self.process.terminate()
            self.process.join(timeout=10)
            if self.process.exitcode is None:
                self.process.kill()
                self.process.join()
        self.result_path.unlink(missing_ok=True)

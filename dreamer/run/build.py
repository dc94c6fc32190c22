"""Everything a run needs, built in one place and in the one order that works:
collector workers are spawned before any compile state exists."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from dreamer.algos.registry import algorithm
from dreamer.config import Config, to_dict
from dreamer.config.ratio import TrainRatio
from dreamer.data.collectors import make_collector, seconds_per_agent_step, worker_policy, workers_hold_a_copy
from dreamer.data.replay import make_replay_buffer, use_pinned_memory
from dreamer.data.supervisor import SupervisedCollector
from dreamer.envs.factory import close_env, make_env, make_eval_env
from dreamer.envs.rendering import configure_mujoco_gl
from dreamer.errors import UserError
from dreamer.report.console import quiet_worker
from dreamer.report.logger import RunLogger
from dreamer.report.openloop import openloop_enabled
from dreamer.run import checkpoint as ckpt
from dreamer.run import lock as run_lock
from dreamer.run import resume
from dreamer.run.background_compile import compiles_in_background
from dreamer.run.cadence import Every, Ratio
from dreamer.run.preflight import CheckedRun, check_run
from dreamer.run.state import Cadence, Run, random_frames_left
from dreamer.run.stopping import Stopper, ignore_stop_signals
from dreamer.system import compile_cache, distributed
from dreamer.system.cpus import (
    IN_LEARNER_COLLECTION_MAX_S,
    CpuBudget,
    collects_in_learner,
    cpu_budget,
    split_cores,
)
from dreamer.system.device import configure_cuda_math, gpu_sized_on_cpu, resolve_autocast
from dreamer.system.memory import retain_freed_host_memory
from dreamer.system.profiling import TraceWindow
from dreamer.system.thread_gain import update_thread_gain_s
from dreamer.system.timing import process_start

log = logging.getLogger("dreamer")

# The replay's generator is seeded apart from torch's global one (seeded with cfg.seed).
REPLAY_SEED_OFFSET = 1_000_003


def build_run(cfg: Config, run_dir: Path, ranks: distributed.Ranks = distributed.Ranks(),
              overridden: set[str] = frozenset(), *, requeue: bool = False, quiet: bool = False,
              checked: CheckedRun | None = None) -> Run:
    """The run's collaborators, restored from its checkpoint when ``cfg.resume`` is set.

    ``overridden``: config keys the command line set (checked against the
    allow-list on resume). ``requeue``: a requeueing scheduler runs us (a stop
    signal then means checkpoint and hand back). ``checked``: what the up-front
    checks (dreamer.run.preflight) found before Hydra created the run directory;
    without it they run here, once the run directory is locked. Whatever was
    built is torn down again if a later step fails (live workers would keep the
    process from exiting: it joins them at exit).

    The stages run in the one order that works: the run directory locked and
    the up-front checks; the process (device, threads, seed); the networks and
    where to collect; the learner and the replay (none of it creates compile
    state); the compile cache directory; the collector workers, spawned before
    any compile state exists (they must not inherit dynamo's); only then
    compiling, the eval env, the logger, and the restore from a checkpoint.
    """
    started = process_start()  # wall_s, first_update_s and train.max_minutes count from here
    stopper = Stopper(requeue=requeue).install()  # SIGTERM/SIGINT/SIGUSR1/2 -> finish cleanly
    with contextlib.ExitStack() as teardown:
        teardown.callback(stopper.uninstall)  # runs last
        vote_group = distributed.cpu_group() if ranks.enabled else None
        teardown.enter_context(claimed_run_dir(cfg, run_dir, ranks, vote_group))  # before any read or write there
        checked = _checked_under_lock(cfg, Path(run_dir), overridden, ranks, checked)
        cfg, resumed_state = checked.cfg, checked.resumed_state
        run_dir = checked.run_dir if resumed_state is not None else Path(run_dir)
        resumed = resumed_state is not None
        stopper.limit_time(started, cfg.train.max_minutes)
        process = _configure_process(cfg, ranks, stopper, vote_group, checked.device)
        device = process.device
        build_models, learner_cls = algorithm(cfg.algo.name)
        models, acting, placement = _build_networks(cfg, ranks, process, build_models, checked.step_bytes)
        learner = learner_cls(
            cfg.algo, cfg.compile, models, device, batch_size=cfg.buffer.batch_size,
            batch_length=cfg.buffer.batch_length, autocast_dtype=process.autocast,
        )
        background = compiles_in_background(learner.compile_cfg, ranks)
        log.info("update path: %s%s", learner.path.describe(),
                 " (eager until the background compile is done)" if background else "")
        # Its own random stream per rank: what it samples never depends on the learner's draws.
        replay = make_replay_buffer(cfg.buffer, device, seed=cfg.seed + REPLAY_SEED_OFFSET * (ranks.rank + 1))
        artifact_sha256 = _use_compile_cache(cfg, run_dir, resumed_state, overridden)
        trace_window = TraceWindow(cfg.profiling, active=ranks.is_main)
        # Released as soon as the loop stops collecting (before the final eval), else at teardown.
        collection = teardown.enter_context(contextlib.ExitStack())
        collection.callback(trace_window.finish)  # after the workers wrote their traces
        random_frames = random_frames_left(cfg.collector.init_random_frames, resumed_state)
        if resumed and random_frames:
            log.info("resumed before its first update: %d random-action agent steps still to collect", random_frames)
        collector = _start_collector(cfg, ranks, stopper, acting, device, placement, trace_window,
                                     random_frames=random_frames, quiet=quiet)
        collection.callback(collector.shutdown)

        if not background:
            learner.compile()  # else the trainer swaps compiled losses in when the child is done
        eval_env = None  # rank 0 alone evaluates
        if ranks.is_main:
            eval_env = make_eval_env(cfg.env, cfg.algo, episodes=cfg.eval.episodes, seed=cfg.seed + 10**6,
                                     record_pixels=cfg.eval.video)
            teardown.callback(close_env, eval_env)
        logger = _run_logger(cfg, run_dir, ranks, resumed_state)
        teardown.callback(logger.close)  # runs first

        run = Run(
            cfg=cfg, run_dir=run_dir, ranks=ranks, device=device, started=started, stopper=stopper,
            models=models, learner=learner, replay=replay, collector=collector, eval_env=eval_env,
            eval_policy=models.policy(explore=False), cadence=_cadence(cfg), logger=logger,
            trace_window=trace_window, openloop=openloop_enabled(cfg.eval, cfg.env), resumed=resumed,
            collection=collection, compile_artifact_sha256=artifact_sha256,
        )
        _restore_and_sync(run, resumed_state)
        if ranks.is_main:
            (run_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
        run.teardown = teardown.pop_all()  # from here on, run.close() tears it down
    return run


@dataclass(frozen=True)
class _Process:
    """This process's setup: where it learns, on how many cores, in which precision."""

    device: torch.device
    cpus: CpuBudget
    autocast: torch.dtype | None
    fast_math: str
    retained: bool  # malloc keeps freed memory (retain_host_memory)


@dataclass(frozen=True)
class _Placement:
    """Where the run collects: collector worker processes beside learner threads."""

    workers: int
    threads: int


def _checked_under_lock(cfg: Config, run_dir: Path, overridden: set[str], ranks: distributed.Ranks,
                        checked: CheckedRun | None) -> CheckedRun:
    """The up-front checks' findings, valid now that the run directory is locked: checked
    here, or (handed over from before Hydra created the directory) still true, a resumed
    checkpoint still the newest. Rank 0 then moves aside the newer checkpoints it could not read."""
    if checked is None or checked.device is None:  # none handed over, or not checked on this machine
        checked = check_run(cfg, overridden, run_dir=run_dir, ranks=ranks)
    elif checked.resumed_state is not None:
        resume.refuse_checkpoints_written_since(checked.run_dir, checked.resumed_state)
    if checked.resumed_state is not None and ranks.is_main:
        ckpt.set_aside_unreadable(checked.resumed_state)
    return checked


def _configure_process(cfg: Config, ranks: distributed.Ranks, stopper: Stopper, vote_group,
                       device: torch.device) -> _Process:
    """Threads (until placement splits the cores), rendering backend, malloc policy,
    seed, autocast and CUDA math for this process, learning on ``device`` (checked)."""
    if ranks.enabled:  # every rank leaves the loop at the same update
        stopper.vote = functools.partial(distributed.max_over_ranks, group=vote_group)
    cpus = cpu_budget(ranks.local_world_size)
    torch.set_num_threads(cfg.threads or cpus.cores)  # until the split by placement
    if cfg.env.backend == "dm_control":
        # Probed once here; workers inherit it. Each rank renders on its own GPU under EGL.
        configure_mujoco_gl(egl_device=device.index if device.type == "cuda" else None)
    retained = cfg.retain_host_memory and retain_freed_host_memory()
    torch.manual_seed(cfg.seed)
    autocast = resolve_autocast(cfg.autocast, device)
    fast_math = configure_cuda_math(device, cfg.cuda_fast_math)
    return _Process(device, cpus, autocast, fast_math, retained)


def _build_networks(cfg: Config, ranks: distributed.Ranks, process: _Process, build_models,
                    step_bytes: int) -> tuple:
    """The algorithm's networks, sized from a proof env; where to collect, from what
    one update's collection costs on that env against what the learner's threads save.
    ``step_bytes``: one replayed step, measured (and the replay's memory checked) by
    the up-front checks. Returns (models, acting policy, placement)."""
    device = process.device
    proof_env = make_env(cfg.env, cfg.algo, seed=cfg.seed)
    try:
        models = build_models(cfg.algo, cfg.env, proof_env, device)
        acting = models.policy(explore=True)  # on the learner's device
        collect_s = collection_cost(cfg, proof_env, acting, device)
        thread_gain_s = learner_thread_gain(cfg, proof_env, acting, collect_s, process.cpus.cores)
    finally:
        close_env(proof_env)
    parameters = sum(p.numel() for p in models.modules.parameters())
    log.info("model: %d parameters", parameters)
    warning = gpu_sized_on_cpu(parameters, device)
    if warning:
        log.warning(warning)
    in_learner = collects_in_learner(device.type, collect_s, thread_gain_s)
    workers, threads = split_cores(process.cpus.cores, cfg.collector.num_workers, cfg.threads,
                                   in_learner=in_learner)
    torch.set_num_threads(threads)
    log.info("%s: %d collector worker(s), %d learner thread(s)%s", process.cpus.describe(), workers, threads,
             describe_collection(cfg, collect_s, workers, thread_gain_s))
    log.info(
        "device=%s workers=%d learner_threads=%d autocast=%s cuda_fast_math=%s retain_host_memory=%s", device,
        workers, torch.get_num_threads(), process.autocast, process.fast_math, process.retained,
    )
    log.info("replay: %d steps x %d bytes = %.2f GiB of host memory, %s", cfg.buffer.capacity, step_bytes,
             cfg.buffer.capacity * step_bytes / 2**30, "page-locked" if use_pinned_memory(cfg.buffer, device)
             else "pageable")
    return models, acting, _Placement(workers, threads)


def _use_compile_cache(cfg: Config, run_dir: Path, resumed_state: dict | None, overridden: set[str]) -> str | None:
    """Inductor's cache directory and the portable artifact to start from (compile_cache.artifact_to_load),
    before the workers spawn (they inherit the cache dir) and before any compile. Returns the sha256 of the
    run's own artifact when it was checked against the checkpoint, for the next checkpoint to record again."""
    compile_cache.use_cache_dir(cfg.compile)
    resumed = resumed_state is not None
    vouched = resumed_state.get("compile_artifact_sha256") if resumed else None
    given = not resumed or resume.given_on_command_line("compile.cache_artifact", overridden)
    artifact = compile_cache.artifact_to_load(cfg.compile, run_dir, resumed=resumed, given=given,
                                              vouched_sha256=vouched)
    if artifact is None or not cfg.compile.enabled:
        return None
    data = compile_cache.read_artifact(artifact)
    if data is None:
        return None
    compile_cache.load_bytes(data, artifact.path)
    return artifact.sha256 or None  # the run's own file, checked: still the one it wrote


def _start_collector(cfg: Config, ranks: distributed.Ranks, stopper: Stopper, acting, device: torch.device,
                     placement: _Placement, trace_window: TraceWindow, *, random_frames: int,
                     quiet: bool) -> SupervisedCollector:
    """The collector workers, spawned now: before any compile state exists (a
    restart after a worker died spawns fresh interpreters: still clean)."""
    collector_device = torch.device(cfg.collector.device)
    return SupervisedCollector(
        lambda collected: make_collector(  # a restart copies the current weights again
            cfg.collector, cfg.env, cfg.algo, cfg.compile, worker_policy(acting, device, collector_device)[0],
            seed=cfg.seed,
            workers=placement.workers, random_frames=max(0, random_frames - collected),  # a restart: what is owed
            learner_threads=placement.threads, worker_hook=trace_window.collector_hook(), rank=ranks.rank,
            worker_init=start_quiet_worker if quiet else ignore_stop_signals,
        ),
        restart=cfg.collector.restart_on_failure, max_restarts=cfg.collector.max_restarts,
        should_stop=lambda: stopper.requested is not None,
        weights_source=acting if workers_hold_a_copy(device, collector_device) else None,
    )


def _cadence(cfg: Config) -> Cadence:
    return Cadence(
        ratio=Ratio(TrainRatio.of(cfg).updates_per_step),
        sync_weights=Every(cfg.collector.weight_sync_every),
        log_due=Every(cfg.logger.log_every),
        eval_due=Every(cfg.eval.every),
        checkpoint_due=Every(cfg.checkpoint.every),
    )


def _run_logger(cfg: Config, run_dir: Path, ranks: distributed.Ranks, resumed_state: dict | None) -> RunLogger:
    """Metrics to CSV / W&B on rank 0; a resumed run continues its W&B run."""
    run_name = "-".join(p for p in (cfg.experiment, cfg.env.name, cfg.model, f"s{cfg.seed}") if p)
    return RunLogger(
        cfg.logger, run_dir, run_name=run_name, config=to_dict(cfg), enabled=ranks.is_main,
        saved_state=resumed_state.get("logger") if resumed_state is not None else None,  # same W&B run
    )


def _restore_and_sync(run: Run, resumed_state: dict | None) -> None:
    """The checkpoint's state (or a fresh start), the same weights on every rank,
    and those weights pushed to the workers where they differ from the spawn's."""
    if resumed_state is not None:
        run.restore(resumed_state)
    else:
        run.logger.rewind(0)  # records of an attempt that died before its first checkpoint
    if run.ranks.enabled:
        distributed.broadcast_module(run.models.modules)  # identical start on every rank
        run.learner.grad_sync = distributed.GradientAverager(run.ranks.world_size)
    if resumed_state is not None or run.ranks.enabled:
        # The workers were spawned with the weights from before the restore (a
        # copy of them where the learner is on another device): send these.
        run.collector.update_policy_weights_()


def collection_cost(cfg: Config, env, policy, device: torch.device) -> float | None:
    """Seconds of env and policy steps one update owes (train_ratio), measured on
    ``env`` in this process; None where ``collector.num_workers`` is set or the
    learner is not on the CPU (nothing to decide)."""
    if cfg.collector.num_workers is not None or device.type != "cpu":
        return None
    return TrainRatio.of(cfg).steps_per_update * seconds_per_agent_step(env, policy)


def learner_thread_gain(cfg: Config, env, policy, collect_s: float | None, cores: int) -> float:
    """Seconds an update saves on the learner's threads instead of one
    (dreamer.system.thread_gain), measured only where it decides where to collect:
    collection measured and above the fixed line."""
    if collect_s is None or collect_s <= IN_LEARNER_COLLECTION_MAX_S:
        return 0.0
    samples = TrainRatio.of(cfg).replayed_per_update
    return update_thread_gain_s(policy, env.reset(), samples, cfg.threads or cores)


def describe_collection(cfg: Config, collect_s: float | None, workers: int, thread_gain_s: float = 0.0) -> str:
    """Why the run collects where it does (the start-up log line's tail)."""
    if cfg.collector.num_workers is not None:
        return " (collector.num_workers set)"
    if collect_s is None:
        return " (a GPU learner: collection in worker processes)"
    where = "in the learner's process" if workers == 0 else "in worker processes"
    line = max(IN_LEARNER_COLLECTION_MAX_S, thread_gain_s)
    why = "" if thread_gain_s <= IN_LEARNER_COLLECTION_MAX_S else " an update's gain from the learner's threads,"
    return (f" (collecting one update's agent steps costs {collect_s * 1e3:.1f} ms "
            f"{'<=' if workers == 0 else '>'}{why} {line * 1e3:.0f} ms: {where})")


def start_quiet_worker() -> None:
    """Collector worker start-up: the main process owns the workers' lifetime (stop
    signals ignored), and the libraries' chatter is filtered as in the main process."""
    ignore_stop_signals()
    quiet_worker()


@contextlib.contextmanager
def claimed_run_dir(cfg: Config, run_dir: Path, ranks: distributed.Ranks, vote_group) -> Iterator[None]:
    """The run directory's lock (dreamer.run.lock) for the ``with`` block, taken by
    rank 0 (the one writer; the other ranks write nothing there and do not lock)
    before anything in the directory is read or written. Every rank learns whether
    rank 0 got it, so all of them stop with one line, none waits in a collective."""
    target, what = (resume.run_dir_to_resume(cfg), "resume") if cfg.resume else (Path(run_dir), "hydra.run.dir")
    with contextlib.ExitStack() as held:
        failure = None
        if ranks.is_main:
            target.mkdir(parents=True, exist_ok=True)
            try:
                held.enter_context(run_lock.hold(target, what))
            except UserError as err:
                failure = err
        if ranks.enabled and distributed.max_over_ranks(int(failure is not None), group=vote_group):
            raise failure or UserError(f"rank 0 could not lock {what}={target}; see its error line")
        if failure is not None:
            raise failure
        yield

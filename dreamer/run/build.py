"""Everything a run needs, built in one place and in the one order that works:
collector workers are spawned before any compile state exists."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import time
from pathlib import Path

import torch

from dreamer.config import Config, to_dict
from dreamer.data.collectors import make_collector, resolve_num_workers
from dreamer.data.replay import bytes_per_step, check_capacity, make_replay_buffer
from dreamer.data.supervisor import SupervisedCollector
from dreamer.envs.factory import check_env, close_env, make_env
from dreamer.report.logger import RunLogger
from dreamer.report.openloop import check_openloop_config, openloop_enabled
from dreamer.run import resume
from dreamer.run.cadence import Every, Ratio
from dreamer.run.state import Cadence, Run
from dreamer.run.stopping import Stopper
from dreamer.system import compile_cache, distributed
from dreamer.system.profiling import TraceWindow
from dreamer.system.resources import resolve_autocast, resolve_device, resolve_threads, retain_freed_host_memory

log = logging.getLogger("dreamer")


def build_run(cfg: Config, run_dir: Path, ranks: distributed.Ranks = distributed.Ranks(),
              overridden: set[str] = frozenset(), *, requeue: bool = False) -> Run:
    """The run's collaborators, restored from its checkpoint when ``cfg.resume`` is set.

    ``overridden``: config keys the command line set (checked against the
    allow-list on resume). ``requeue``: a requeueing scheduler runs us (a stop
    signal then means checkpoint and hand back). Whatever was built is torn
    down again if a later step fails (live workers would keep the process
    from exiting: it joins them at exit).
    """
    from dreamer.run.trainer import ALGORITHMS  # TODO(merge): dreamer.algos.registry

    started = time.perf_counter()
    stopper = Stopper(requeue=requeue).install()  # SIGTERM/SIGINT/SIGUSR1/2 -> finish cleanly
    with contextlib.ExitStack() as teardown:
        teardown.callback(stopper.uninstall)  # runs last
        resumed_state = None
        if cfg.resume:
            run_dir, cfg, resumed_state = resume.open_run(cfg, overridden)
        else:
            resume.refuse_run_dir_with_checkpoints(Path(run_dir))
        run_dir = Path(run_dir)
        stopper.limit_time(started, cfg.train.max_minutes)
        check_env(cfg.env)  # a bad env name fails here, in one line, not in a worker
        check_openloop_config(cfg)

        device = distributed.rank_device(resolve_device(cfg), ranks)
        if ranks.enabled:  # every rank leaves the loop at the same update
            stopper.vote = functools.partial(distributed.max_over_ranks, device=device)
        workers = resolve_num_workers(cfg)
        threads = resolve_threads(cfg, workers)
        torch.set_num_threads(threads)
        retained = cfg.retain_host_memory and retain_freed_host_memory()
        torch.manual_seed(cfg.seed)
        autocast = resolve_autocast(cfg, device)
        log.info(
            "device=%s workers=%d learner_threads=%d autocast=%s retain_host_memory=%s", device,
            workers, torch.get_num_threads(), autocast, retained,
        )

        a = cfg.algo
        proof_env = make_env(cfg.env, state_dim=a.latent_state_dim, belief_dim=a.rssm_hidden_dim, seed=cfg.seed)
        build_models, learner_cls = ALGORITHMS[cfg.algo.name]
        models = build_models(cfg, proof_env, device)
        step_bytes = bytes_per_step(proof_env.rollout(1), models.obs_key)
        close_env(proof_env)
        need = check_capacity(cfg, step_bytes)
        log.info("replay: %d steps x %d bytes = %.2f GiB", cfg.buffer.capacity, step_bytes, need / 2**30)

        # Before the workers spawn (they inherit the cache dir) and before any compile.
        compile_cache.use_cache_dir(cfg.compile)
        artifact = compile_cache.artifact_to_load(cfg.compile, run_dir, resumed_state is not None)
        if artifact is not None and cfg.compile.enabled:
            compile_cache.load_artifact(artifact)

        random_frames = cfg.collector.init_random_frames
        if resumed_state is not None:
            random_frames = 0  # the policy is trained already
        trace_window = TraceWindow(cfg.profiling, active=ranks.is_main)
        # Released as soon as the loop stops collecting (before the final eval), else at teardown.
        collection = teardown.enter_context(contextlib.ExitStack())
        collection.callback(trace_window.finish)  # after the workers wrote their traces
        # Collectors first: workers are spawned before any compile state exists
        # (a restart after a worker died spawns fresh interpreters: still clean).
        collector = SupervisedCollector(
            lambda restarted: make_collector(
                cfg, models.policy(explore=True), random_frames=0 if restarted else random_frames,
                learner_threads=threads, worker_hook=trace_window.collector_hook(), rank=ranks.rank,
            ),
            restart=cfg.collector.restart_on_failure, max_restarts=cfg.collector.max_restarts,
            should_stop=lambda: stopper.requested is not None,
        )
        collection.callback(collector.shutdown)

        learner = learner_cls(cfg, models, device, autocast)
        replay = make_replay_buffer(cfg, device)
        learner.compile()
        eval_env = make_env(
            cfg.env, state_dim=a.latent_state_dim, belief_dim=a.rssm_hidden_dim,
            seed=cfg.seed + 10**6, record_pixels=cfg.eval.video,
        )
        teardown.callback(close_env, eval_env)
        updates_per_step = cfg.train.train_ratio / (cfg.buffer.batch_size * cfg.buffer.batch_length)
        cadence = Cadence(
            ratio=Ratio(updates_per_step),
            sync_weights=Every(cfg.collector.weight_sync_every),
            log_due=Every(cfg.logger.log_every),
            eval_due=Every(cfg.eval.every),
            checkpoint_due=Every(cfg.checkpoint.every),
        )
        logger = RunLogger(cfg, run_dir, enabled=ranks.is_main)
        teardown.callback(logger.close)  # runs first

        run = Run(
            cfg=cfg, run_dir=run_dir, ranks=ranks, device=device, started=started, stopper=stopper,
            models=models, learner=learner, replay=replay, collector=collector, eval_env=eval_env,
            eval_policy=models.policy(explore=False), cadence=cadence, logger=logger,
            trace_window=trace_window, openloop=openloop_enabled(cfg), resumed=resumed_state is not None,
            collection=collection,
        )
        if resumed_state is not None:
            run.restore(resumed_state)
        else:
            logger.rewind(0)  # lines of an attempt that died before its first checkpoint
        if ranks.enabled:
            distributed.broadcast_module(models.modules)  # identical start on every rank
            learner.grad_sync = distributed.GradientAverager(ranks.world_size)
        if ranks.is_main:
            (run_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
        run.teardown = teardown.pop_all()  # from here on, run.close() tears it down
    return run

"""The train loop, top to bottom: collect -> store -> update -> maybe sync / log / eval / checkpoint."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import tqdm
from torch.profiler import record_function

from dreamer.run import checkpoint as ckpt
from dreamer.system import compile_cache, distributed
from dreamer.run import health, preemption, resume
from dreamer.run.cadence import Every, Ratio
from dreamer.data.collectors import make_collector
from dreamer.config import Config, to_dict
from dreamer.envs.factory import check_env, close_env, make_env
from dreamer.envs.rendering import configure_mujoco_gl
from dreamer.report.evaluation import EvalResult, evaluate
from dreamer.algos.registry import algorithm
from dreamer.report.openloop import check_openloop_config, openloop_enabled, openloop_video
from dreamer.system.profiling import TraceWindow
from dreamer.data.replay import bytes_per_step, check_capacity, load_replay_state, make_replay_buffer, replay_state, write
from dreamer.system.device import resolve_autocast, resolve_device
from dreamer.system.memory import retain_freed_host_memory
from dreamer.system.cpus import cpu_budget, split_cores
from dreamer.report.logger import RunLogger
from dreamer.run.signals import StopRequest
from dreamer.data.supervisor import SupervisedCollector, WorkerDied

log = logging.getLogger("dreamer")


@dataclass
class Counters:
    frames: int = 0  # env frames (agent steps x action repeat)
    steps: int = 0  # agent steps stored
    updates: int = 0
    timers: dict = field(default_factory=lambda: {"random_phase_s": 0.0, "compile_warmup_s": 0.0, "eval_s": 0.0})


class Trainer:
    def __init__(self, cfg: Config, run_dir: Path, ranks: distributed.Ranks = distributed.Ranks(),
                 overridden: set[str] = frozenset()):
        self.started = time.perf_counter()  # train.max_minutes and wall_s count from here
        self.stop = StopRequest().install()  # SIGTERM/SIGINT/SIGUSR1 -> finish cleanly
        self.resumed_state = None
        if cfg.resume:
            run_dir, cfg, self.resumed_state = resume.open_run(cfg, overridden)
        else:
            resume.refuse_run_dir_with_checkpoints(Path(run_dir))
        self.cfg, self.run_dir, self.ranks = cfg, Path(run_dir), ranks
        budget = cfg.train.max_minutes
        self.deadline = None if budget is None else self.started + 60.0 * budget
        check_openloop_config(cfg.eval, cfg.env, cfg.buffer.batch_length)

        self.device = distributed.rank_device(resolve_device(cfg.device), ranks)
        cpus = cpu_budget(ranks.local_world_size)
        workers, threads = split_cores(cpus.cores, cfg.collector.num_workers, cfg.threads)
        log.info("%s: %d collector worker(s), %d learner thread(s)", cpus.describe(), workers, threads)
        torch.set_num_threads(threads)
        if cfg.env.backend == "dm_control":
            # Probed once here; workers inherit it. Each rank renders on its own GPU under EGL.
            configure_mujoco_gl(egl_device=self.device.index if self.device.type == "cuda" else None)
        check_env(cfg.env, cfg.algo)  # a bad env name fails here, in one line, not in a worker
        retained = cfg.retain_host_memory and retain_freed_host_memory()
        torch.manual_seed(cfg.seed)
        autocast = resolve_autocast(cfg.autocast, self.device)
        log.info(
            "device=%s workers=%d learner_threads=%d autocast=%s retain_host_memory=%s", self.device,
            workers, torch.get_num_threads(), autocast, retained,
        )

        proof_env = make_env(cfg.env, cfg.algo, seed=cfg.seed)
        build, learner_cls = algorithm(cfg.algo.name)
        self.models = build(cfg.algo, cfg.env, proof_env, self.device)
        step_bytes = bytes_per_step(proof_env.rollout(1), self.models.obs_key)
        close_env(proof_env)
        need = check_capacity(cfg.buffer, step_bytes)
        log.info("replay: %d steps x %d bytes = %.2f GiB", cfg.buffer.capacity, step_bytes, need / 2**30)

        # Before the workers spawn (they inherit the cache dir) and before any compile.
        compile_cache.use_cache_dir(cfg.compile)
        artifact = compile_cache.artifact_to_load(cfg.compile, self.run_dir, self.resumed_state is not None)
        if artifact is not None and cfg.compile.enabled:
            compile_cache.load_artifact(artifact)

        self.counters = Counters()
        random_frames = cfg.collector.init_random_frames
        if self.resumed_state is not None:
            random_frames = 0  # the policy is trained already
        self.trace_window = TraceWindow(cfg.profiling, active=ranks.is_main)
        # Collectors first: workers are spawned before any compile state exists
        # (a restart after a worker died spawns fresh interpreters: still clean).
        self.collector = SupervisedCollector(
            lambda restarted: make_collector(
                cfg.collector, cfg.env, cfg.algo, cfg.compile, self.models.policy(explore=True), seed=cfg.seed,
                workers=workers,
                random_frames=0 if restarted else random_frames,
                learner_threads=threads, worker_hook=self.trace_window.collector_hook(), rank=ranks.rank,
            ),
            restart=cfg.collector.restart_on_failure, max_restarts=cfg.collector.max_restarts,
            should_stop=lambda: self.stop.requested is not None,
        )

        try:
            self.learner = learner_cls(
                cfg.algo, cfg.compile, self.models, self.device,
                batch_size=cfg.buffer.batch_size, batch_length=cfg.buffer.batch_length, autocast_dtype=autocast,
            )
            self.replay = make_replay_buffer(cfg.buffer, self.device)
            self.learner.compile()
            self.eval_env = make_env(cfg.env, cfg.algo, seed=cfg.seed + 10**6, record_pixels=cfg.eval.video)
            self.eval_policy = self.models.policy(explore=False)

            updates_per_step = cfg.train.train_ratio / (cfg.buffer.batch_size * cfg.buffer.batch_length)
            self.ratio = Ratio(updates_per_step)
            self.sync_weights = Every(cfg.collector.weight_sync_every)
            self.log_due = Every(cfg.logger.log_every)
            self.eval_due = Every(cfg.eval.every)
            self.checkpoint_due = Every(cfg.checkpoint.every)
            run_name = "-".join(p for p in (cfg.experiment, cfg.env.name, cfg.model, f"s{cfg.seed}") if p)
            self.logger = RunLogger(cfg.logger, self.run_dir, run_name=run_name, config=to_dict(cfg),
                                    enabled=ranks.is_main)
            self.last_eval: EvalResult | None = None
            self.warm = False
            if self.resumed_state is not None:
                self._restore(self.resumed_state)
            else:
                self.logger.rewind(0)  # lines of an attempt that died before its first checkpoint
            if ranks.enabled:
                distributed.broadcast_module(self.models.modules)  # identical start on every rank
                self.learner.grad_sync = distributed.GradientAverager(ranks.world_size)
            if ranks.is_main:
                (self.run_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
        except BaseException:
            # Live workers would keep this process from exiting (it joins them at exit).
            self.collector.shutdown()
            raise

    # -- state ----------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "config": to_dict(self.cfg),
            "counters": {"frames": self.counters.frames, "steps": self.counters.steps,
                         "updates": self.counters.updates},
            "learner": self.learner.state_dict(),
            "cadence": {name: getattr(self, name).state_dict() for name in
                        ("ratio", "sync_weights", "log_due", "eval_due", "checkpoint_due")},
            "rng": ckpt.rng_state(),
            **({"replay": replay_state(self.replay)} if self.cfg.checkpoint.replay else {}),
        }

    def _restore(self, state: dict) -> None:
        c = state["counters"]
        self.counters.frames, self.counters.steps, self.counters.updates = c["frames"], c["steps"], c["updates"]
        self.learner.load_state_dict(state["learner"])
        for name, sub in state["cadence"].items():
            getattr(self, name).load_state_dict(sub)
        ckpt.set_rng_state(state["rng"])
        if "replay" in state:
            load_replay_state(self.replay, state["replay"])
            log.info("replay buffer restored: %d steps", len(self.replay))
        else:
            log.info("replay buffer not in the checkpoint (checkpoint.replay=false): refilling it")
        self.logger.rewind(c["updates"])  # lines logged after this checkpoint are replayed anew
        log.info("checkpoint %s", state["path"])
        log.info("resumed from %s at frames=%d updates=%d", self.run_dir, c["frames"], c["updates"])

    def save(self) -> Path | None:
        if not self.ranks.is_main:
            return None  # the weights are rank 0's
        return ckpt.save_checkpoint(self.run_dir, self.state_dict(), self.counters.updates, self.cfg.checkpoint.keep)

    # -- phases ---------------------------------------------------------------
    def _ready_to_learn(self) -> bool:
        b = self.cfg.buffer
        needed = b.batch_size * b.batch_length
        if self.resumed_state is None:
            needed = max(needed, self.cfg.collector.init_random_frames)
        return len(self.replay) >= needed

    def _warm_up(self) -> None:
        """Compile and warm the learner on real data before the first update."""
        seconds = self.learner.warmup(self.replay.sample())
        self.counters.timers["compile_warmup_s"] = seconds
        log.info("compile warm-up: %.1f s", seconds)
        if self.cfg.compile.enabled and self.ranks.is_main:  # one writer per run dir
            compile_cache.save_artifact(self.run_dir)  # portable: compile.cache_artifact=<this file>
        self.warm = True

    def _evaluate(self) -> None:
        if not self.ranks.is_main:
            return
        start = time.perf_counter()
        c = self.cfg
        result = evaluate(
            self.eval_env, self.eval_policy, episodes=c.eval.episodes,
            max_steps=c.env.max_episode_steps, record=c.eval.video,
        )
        self.last_eval = result
        record = {"frames": self.counters.frames, "updates": self.counters.updates,
                  "eval_return_mean": result.mean, "eval_return_std": result.std,
                  "eval_episodes": len(result.returns),
                  "wall_s": time.perf_counter() - self.started}  # since this process started
        self.logger.log(record)
        if result.frames is not None:
            self.logger.log_video(result.frames, "eval_video", self.counters.frames)
        if openloop_enabled(c.eval, c.env) and self.warm:  # warm: replay holds whole sequences
            self._log_openloop()
        self.counters.timers["eval_s"] += time.perf_counter() - start

    def _log_openloop(self) -> None:
        """Open-loop imagination on one replayed batch, prepared as the learner prepares it."""
        batch = self.learner.prepare(self.replay.sample())  # (B, T), on the learner's device
        video = openloop_video(
            self.models, batch, context=self.cfg.eval.openloop_context,
            sequences=self.cfg.eval.openloop_sequences,
        )  # (T, 3*64, N*64, 3) uint8
        self.logger.log_video(video.cpu(), "openloop", self.counters.frames)

    def _log(self, since: float, updates0: int, frames0: int) -> None:
        elapsed = max(time.perf_counter() - since - self.counters.timers["eval_s"], 1e-9)
        record = {"frames": self.counters.frames, "updates": self.counters.updates}
        record.update(self.learner.flush_metrics())  # the one host sync of this interval
        record["updates_per_s"] = (self.counters.updates - updates0) / elapsed
        record["frames_per_s"] = (self.counters.frames - frames0) / elapsed
        record["train_ratio_achieved"] = self._train_ratio_achieved()
        self.logger.log(record)
        health.stop_if_diverged(record, self.cfg.train.stop_after_nonfinite, self.save)

    def _train_ratio_achieved(self) -> float:
        """Replayed steps per agent step so far (host counters, no device sync):
        train.train_ratio as delivered. Below it by the share of steps collected
        before learning starts (the random phase, a refill after resume)."""
        b, n = self.cfg.buffer, self.counters
        return n.updates * b.batch_size * b.batch_length / max(n.steps, 1)

    # -- loop -----------------------------------------------------------------
    def run(self) -> dict:
        cfg, n = self.cfg, self.counters
        start, loop_start = self.started, time.perf_counter()
        leave = None  # why the loop ended early: "signal" or "max_minutes"
        obs_key = self.models.obs_key
        bar = tqdm.tqdm(total=cfg.train.total_frames, initial=n.frames, unit="frame",
                        disable=not cfg.logger.progress_bar, dynamic_ncols=True)
        steady_start, updates0, frames0 = None, n.updates, n.frames
        try:
            for batch in self.collector:
                with record_function("## collect/write ##"):
                    steps = write(self.replay, batch, obs_key)
                n.steps += steps
                n.frames += steps * cfg.env.action_repeat
                bar.update(steps * cfg.env.action_repeat)
                if not self._ready_to_learn():
                    continue
                if not self.warm:
                    n.timers["random_phase_s"] = time.perf_counter() - loop_start
                    self._warm_up()
                    self.ratio.owed(0)
                    steady_start, updates0, frames0 = time.perf_counter(), n.updates, n.frames
                    n.timers["eval_s"] = 0.0
                owed = self.ratio.owed(steps)
                for paid in range(owed):
                    # Checked before every update: a batch can owe minutes of
                    # updates, longer than a scheduler's warning before its kill.
                    leave = self._leave()
                    if leave is not None:
                        self.ratio.refund(owed - paid)  # still owed after a resume
                        break
                    with self.trace_window.update(n.updates + 1):
                        with record_function("## train/sample ##"):
                            sample = self.replay.sample()
                        self.learner.update(sample)
                    n.updates += 1
                    if self.sync_weights(n.updates):
                        self.collector.update_policy_weights_()
                    if self.log_due(n.updates):
                        self._log(steady_start, updates0, frames0)
                    if self.eval_due(n.updates):
                        self._evaluate()
                    if self.checkpoint_due(n.updates):
                        self.save()
                if self.last_eval is not None:
                    bar.set_postfix(updates=n.updates, eval=f"{self.last_eval.mean:.1f}", refresh=False)
                else:
                    bar.set_postfix(updates=n.updates, refresh=False)
                if leave is not None or n.frames >= cfg.train.total_frames:
                    break
                leave = self._leave()
                if leave is not None:
                    break
        except WorkerDied as err:
            path = self.save()  # nothing lost: the run continues from here
            raise WorkerDied(f"{err}; final checkpoint {path}; continue with resume={self.run_dir}") from None
        finally:
            bar.close()
            self.collector.shutdown()
            self.trace_window.finish()
        stopping = leave == "signal"
        if stopping and preemption.installed():
            return self._stop_for_preemption()  # a requeueing scheduler continues the run
        if steady_start is None:
            steady_start = time.perf_counter()
        steady = max(time.perf_counter() - steady_start - n.timers["eval_s"], 1e-9)
        rank_info = {}
        if self.ranks.enabled:
            rank_info = {"world_size": self.ranks.world_size,
                         "max_param_divergence": distributed.max_divergence(self.models.modules)}
        if stopping:  # a deadline is near: checkpoint first, no evaluation
            log.info("stopped by %s at frames=%d updates=%d", self.stop.requested or "rank signal",
                     n.frames, n.updates)
        else:
            self._evaluate()
        self.save()
        if not self.ranks.is_main:
            close_env(self.eval_env)
            self.stop.uninstall()
            return {"frames": n.frames, "updates": n.updates, **rank_info}
        last_eval = self.last_eval
        summary = {
            **rank_info,
            "frames": n.frames,
            "updates": n.updates,
            "wall_s": time.perf_counter() - start,
            "updates_per_s": (n.updates - updates0) / steady,
            "frames_per_s": (n.frames - frames0) / steady,
            "train_ratio_achieved": self._train_ratio_achieved(),
            "eval_return_mean": last_eval.mean if last_eval else None,
            "eval_return_std": last_eval.std if last_eval else None,
            "eval_episodes": len(last_eval.returns) if last_eval else 0,
            "stopped_by": self.stop.requested,
            "finished_by": leave or "total_frames",
            **{k: v for k, v in n.timers.items()},
        }
        self.logger.write_summary(summary)
        self.logger.log_learning_curve(n.frames)
        self.logger.close()
        close_env(self.eval_env)
        self.stop.uninstall()
        return summary

    _LEAVE_REASONS = (None, "max_minutes", "signal")  # in rising priority

    def _leave(self) -> str | None:
        """Why the loop must end now, the same on every rank (they leave together):
        a stop signal (here or on any rank), the wall-clock budget, or None."""
        if self.stop.requested is not None or preemption.requested():
            local = 2
        elif self.deadline is not None and time.perf_counter() >= self.deadline:
            local = 1
        else:
            local = 0
        if self.ranks.enabled:
            local = distributed.max_over_ranks(local, self.device)
        return self._LEAVE_REASONS[local]

    def _stop_for_preemption(self) -> dict:
        """Under a requeueing scheduler: checkpoint and return; no final eval or
        summary, as the run is not finished (the requeued job resumes it)."""
        path = self.save()
        log.info("stop requested (%s): checkpoint %s at frames=%d updates=%d",
                 self.stop.requested or preemption.requested_by(), path,
                 self.counters.frames, self.counters.updates)
        self.logger.close()
        close_env(self.eval_env)
        self.stop.uninstall()
        return {"preempted": True, "run_dir": str(self.run_dir),
                "frames": self.counters.frames, "updates": self.counters.updates}


def train(cfg: Config, run_dir: Path, ranks: distributed.Ranks = distributed.Ranks(),
          overridden: set[str] = frozenset()) -> dict:
    """``overridden``: config keys the command line set (checked against the allow-list on resume)."""
    return Trainer(cfg, run_dir, ranks, overridden).run()

"""The train loop, top to bottom: collect -> store -> update -> maybe sync / log / eval / checkpoint."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from pathlib import Path

from torch.profiler import record_function

from dreamer.config import Config
from dreamer.config.ratio import TrainRatio
from dreamer.config.validate import steps_before_learning
from dreamer.data.replay import write
from dreamer.data.supervisor import WorkerDied
from dreamer.report.episodes import CollectedEpisodes
from dreamer.report.eval_metrics import return_key
from dreamer.report.evaluation import EvalResult, evaluate
from dreamer.report.openloop import openloop_video
from dreamer.report.progress import Progress
from dreamer.report.throughput import Throughput
from dreamer.run import health
from dreamer.run.background_compile import compiles_in_background
from dreamer.run.build import build_run
from dreamer.run.compile_switch import CompileSwitch
from dreamer.run.preflight import CheckedRun
from dreamer.run.result import FinishedBy, RunResult
from dreamer.run.state import Run
from dreamer.run.stopping import StopReason, StopRequested
from dreamer.system import distributed
from dreamer.system.memory import PeakGrowth
from torchrl_ext import DeliversSamplesInto

log = logging.getLogger("dreamer")


def train(cfg: Config, run_dir: Path, ranks: distributed.Ranks = distributed.Ranks(),
          overridden: set[str] = frozenset(), *, requeue: bool = False, quiet: bool = False,
          checked: CheckedRun | None = None) -> RunResult:
    """``overridden``: config keys the command line set (checked against the allow-list on resume);
    ``requeue``: a requeueing scheduler runs us (see dreamer.run.stopping); ``quiet``: collector
    workers filter library chatter too (dreamer.report.console); ``checked``: the up-front checks'
    findings, when they ran before Hydra (dreamer.check)."""
    return Trainer(build_run(cfg, run_dir, ranks, overridden, requeue=requeue, quiet=quiet, checked=checked)).run()


class Trainer:
    """Drives a built :class:`Run` to its end: ``run()``, once."""

    def __init__(self, run: Run):
        self.built = run  # the run's collaborators (dreamer.run.build)
        self.warm = False  # learning has started (the learner compiled and warmed, or compiling in the background)
        self.compile_switch = CompileSwitch(run)  # compile.background: eager updates until the child is done
        self.replay_destination = None  # the captured update's static inputs the replay fills, once captured
        self.last_eval: EvalResult | None = None
        self.saved_at_stop = False  # a stop signal's checkpoint is written before the workers shut down
        self.stop_checkpoint: Path | None = None
        self.episodes = CollectedEpisodes()  # the collector's finished episodes, until the next log record
        self.progress: Progress | None = None  # the bar, from the loop's start
        self.throughput = Throughput()  # from the end of the warm-up, eval time excluded

    def run(self) -> RunResult:
        run = self.built
        try:
            try:
                reason = self._train()
            except WorkerDied as err:
                path = run.save()  # nothing lost: the run continues from here
                raise WorkerDied(f"{err}; final checkpoint {path}; continue with resume={run.run_dir}") from None
            finished_by = run.stopper.finished_by(reason)
            if finished_by in (FinishedBy.SIGNAL, FinishedBy.PREEMPTED):  # first: a scheduler's kill follows its signal
                self.stop_checkpoint, self.saved_at_stop = run.save(), True
            run.collection.close()  # progress bar, workers, trace window: done before the final eval
            return self._finish(finished_by)
        finally:
            run.close()  # the one teardown, on every way out

    # -- the loop -------------------------------------------------------------
    def _train(self) -> StopReason | None:
        """Collect and learn until train.total_frames (None) or a stop (its reason)."""
        run, n, cfg = self.built, self.built.counters, self.built.cfg
        loop_start = time.perf_counter()
        self.progress = Progress(
            total_frames=cfg.train.total_frames, frames=n.frames, eval_every=cfg.eval.every,
            frames_per_update=TrainRatio.of(cfg).frames_per_update(cfg.env.action_repeat),
            enabled=cfg.logger.progress_bar,
        )
        run.collection.callback(self.progress.close)
        if not n.updates:
            log.info("filling the replay: %d agent steps before the first update", steps_before_learning(cfg))
        for batch in run.collector:
            steps = self._store(batch)
            self.progress.collected(steps * cfg.env.action_repeat)
            if self._ready_to_learn():
                if not self.warm:
                    n.timers.random_phase_s = time.perf_counter() - loop_start
                    if not self._warm_up():
                        return StopReason.SIGNAL
                reason = self._pay(run.cadence.ratio.owed(steps))
                self.progress.learned(n.updates)
                if reason is not None and n.frames < cfg.train.total_frames:
                    return reason
            # Also before learning starts: collection ends at total_frames whatever happened.
            if n.frames >= cfg.train.total_frames:
                return None  # done, even where a stop came at its last updates: nothing is left to resume
            # Also while the replay fills: a stop must not wait for the warm-up's compile.
            reason = run.stopper.poll()
            if reason is not None:
                return reason
        return None

    def _pay(self, owed: int) -> StopReason | None:
        """Make the ``owed`` updates; stop early (returning why) when the stopper says so."""
        for paid in range(owed):
            # Checked before every update: a batch can owe minutes of updates,
            # longer than a scheduler's warning before its kill.
            reason = self.built.stopper.poll(before_update=self.built.counters.updates + 1)
            if reason is not None:
                self.built.cadence.ratio.refund(owed - paid)  # still owed after a resume
                return reason
            self._update()
        return None

    def _update(self) -> None:
        """One learner update, then whatever is due after it."""
        run, n, due = self.built, self.built.counters, self.built.cadence
        switch = self.compile_switch
        switch.poll()
        start = time.perf_counter()
        # The first update's memory sizes the background compile child (it repeats an update).
        sizing = PeakGrowth(run.device) if switch.due else contextlib.nullcontext()
        with run.trace_window.update(n.updates + 1), sizing:
            with record_function("## train/sample ##"):
                sample = run.replay.sample()
            run.learner.update(sample)
        n.updates += 1
        self._feed_captured_update()
        if switch.due:
            switch.start(sizing.bytes)
        if n.timers.first_update_s is None:
            n.timers.first_update_s = time.perf_counter() - run.started  # process start -> first update
        switch.after_update(time.perf_counter() - start)
        if due.sync_weights(n.updates):
            run.collector.update_policy_weights_()  # staged; published when ready, without waiting
        else:
            run.collector.publish_pending_weights()
        if due.log_due(n.updates):
            self._log()
        evaluated_last = due.eval_due.last
        evaluate_now = due.eval_due(n.updates)  # marked done in the checkpoint below
        if due.checkpoint_due(n.updates):
            run.save()  # before the evaluation: a stop during it costs no updates
        if evaluate_now and not self._evaluate():
            due.eval_due.last = evaluated_last  # stopped mid-way: the final checkpoint keeps it owed

    def _feed_captured_update(self) -> None:
        """A captured update (compile.update=captured) reads fixed device buffers: once
        it is captured (again), the replay copies every sample straight into them."""
        run = self.built
        if not isinstance(run.replay, DeliversSamplesInto):  # a CPU learner's replay: nothing to feed
            return
        buffer = run.learner.input_buffer()
        if buffer is self.replay_destination:
            return
        run.replay.deliver_into(buffer)
        self.replay_destination = buffer
        if buffer is not None:
            log.info("update %d captured in a CUDA graph: replayed from here on, samples copied into its inputs",
                     run.counters.updates)

    # -- phases ---------------------------------------------------------------
    def _store(self, batch) -> int:
        """A collector batch into the replay buffer; returns its agent steps."""
        n = self.built.counters
        with record_function("## collect/write ##"):
            steps = write(self.built.replay, batch, self.built.models.obs_key)
        self.episodes.add(batch)
        n.steps += steps
        n.frames += steps * self.built.cfg.env.action_repeat
        return steps

    def _ready_to_learn(self) -> bool:
        """The replay holds what the first update needs (the random prefill included) or,
        once learning has started (a resumed run refilling its replay), one batch of sequences;
        and some env's stream holds a whole sequence."""
        run = self.built
        needed = TrainRatio.of(run.cfg).replayed_per_update if run.counters.updates else steps_before_learning(run.cfg)
        return len(run.replay) >= needed and run.replay.can_sample()

    def _warm_up(self) -> bool:
        """Compile and warm the learner on real data before the first update, or
        start compiling in the background (compile.background) and learn eager meanwhile.
        False when a stop signal came during the compile (abandoned: it has no safe point)."""
        run, n = self.built, self.built.counters
        if compiles_in_background(run.learner.compile_cfg, run.ranks):
            self.compile_switch.due = True
        else:
            if run.learner.compile_cfg.enabled:
                log.info("compiling the losses before the first update (compile.background=false)")
                self.progress.phase("compiling the losses (warm-up)")
            try:
                with run.stopper.interruptible():
                    seconds = run.learner.warmup(run.replay.sample())
            except StopRequested:
                log.info("stop requested during the compile warm-up: warm-up abandoned")
                return False
            n.timers.compile_warmup_s = seconds
            log.info("compile warm-up: %.1f s", seconds)
            if run.learner.compile_cfg.enabled and run.ranks.is_main:  # one writer per run dir
                run.save_compile_artifact()  # portable: compile.cache_artifact=<this file>
        self.warm = True
        n.timers.eval_s = 0.0
        self.throughput.begin(n.updates, n.frames)
        return True

    def _evaluate(self) -> bool:
        """Evaluate, log and record; False when a stop signal cut it short (nothing logged)."""
        run, n, c = self.built, self.built.counters, self.built.cfg
        if not run.ranks.is_main:
            return True
        start = time.perf_counter()
        result = evaluate(run.eval_env, run.eval_policy, episodes=c.eval.episodes, max_steps=c.env.max_episode_steps,
                          record=c.eval.video, acting=c.eval.policy,
                          should_stop=lambda: run.stopper.requested is not None)
        if result is None:
            log.info("stop requested during the evaluation at update %d: evaluation abandoned", n.updates)
            return False
        self.last_eval = result
        if self.progress is not None:
            self.progress.evaluated(time.perf_counter() - start, result.mean)
        run.logger.log({"frames": n.frames, "updates": n.updates,
                      return_key(c.eval.policy): result.mean, return_key(c.eval.policy, "std"): result.std,
                      "eval_episodes": len(result.returns),
                      "wall_s": time.perf_counter() - run.started})  # since this process started
        if result.frames is not None:
            run.logger.log_video(result.frames, "eval_video", n.frames)
        if run.openloop and self.warm:  # warm: replay holds whole sequences
            self._log_openloop()
        n.timers.eval_s += time.perf_counter() - start
        return True

    def _log_openloop(self) -> None:
        """Open-loop imagination on one replayed batch, prepared as the learner prepares it."""
        run = self.built
        batch = run.learner.prepare(run.replay.sample())  # (B, T), on the learner's device
        video = openloop_video(
            run.models, batch, context=run.cfg.eval.openloop_context, sequences=run.cfg.eval.openloop_sequences,
        )  # (T, 3*64, N*64, 3) uint8
        run.logger.log_video(video.cpu(), "openloop", run.counters.frames)

    def _log(self) -> None:
        run, n = self.built, self.built.counters
        record = {"frames": n.frames, "updates": n.updates}
        record.update(run.learner.flush_metrics())  # the one host sync of this interval
        record.update(self.throughput.overall(n.updates, n.frames, n.timers.eval_s))
        record.update(self.throughput.interval(n.updates, n.frames, n.timers.eval_s))
        record.update(self.episodes.flush())
        record["train_ratio_achieved"] = self._train_ratio_achieved()
        run.logger.log(record)
        health.stop_if_diverged(record, run.cfg.train.stop_after_nonfinite, run.save)

    def _train_ratio_achieved(self) -> float:
        """Replayed steps per agent step so far (host counters, no device sync):
        train.train_ratio as delivered. Below it by the share of steps collected
        before learning starts (the random phase, a refill after resume)."""
        n = self.built.counters
        return TrainRatio.of(self.built.cfg).achieved(n.updates, n.steps)

    # -- the end --------------------------------------------------------------
    def _finish(self, finished_by: FinishedBy) -> RunResult:
        """Final checkpoint (after a stop signal: written already), and unless preempted: final eval
        (skipped after a stop signal: a deadline is near) and summary.json."""
        run, n = self.built, self.built.counters
        if finished_by is FinishedBy.PREEMPTED:
            # The run is not finished: the requeued job resumes it from this checkpoint (run() wrote it).
            log.info("stop requested (%s): checkpoint %s at frames=%d updates=%d",
                     run.stopper.why, self.stop_checkpoint, n.frames, n.updates)
            return RunResult(finished_by, run.run_dir, n.frames, n.updates, stopped_by=run.stopper.requested)
        rates = self.throughput.overall(n.updates, n.frames, n.timers.eval_s)  # before the final eval
        ranks = {}
        if run.ranks.enabled:
            ranks = {"world_size": run.ranks.world_size,
                     "max_param_divergence": distributed.max_divergence(run.models.modules)}
        if finished_by is FinishedBy.SIGNAL:
            log.info("stopped by %s at frames=%d updates=%d", run.stopper.why, n.frames, n.updates)
        else:
            self._evaluate()
        if not self.saved_at_stop:
            run.save()
        last = self.last_eval
        result = RunResult(
            finished_by, run.run_dir, n.frames, n.updates, stopped_by=run.stopper.requested,
            wall_s=time.perf_counter() - run.started, **rates,
            train_ratio_achieved=self._train_ratio_achieved(),
            eval_policy=run.cfg.eval.policy,
            eval_return_mean=last.mean if last else None, eval_return_std=last.std if last else None,
            eval_episodes=len(last.returns) if last else 0, timers=dataclasses.replace(n.timers), **ranks,
        )
        run.logger.write_summary(result.to_dict())  # rank 0 only (the others' logger writes nothing)
        run.logger.log_learning_curve(n.frames)
        return result

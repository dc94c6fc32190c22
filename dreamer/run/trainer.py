"""The train loop, top to bottom: collect -> store -> update -> maybe sync / log / eval / checkpoint."""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

from torch.profiler import record_function

from dreamer.config import Config
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
from dreamer.run.result import RunResult
from dreamer.run.state import Run
from dreamer.run.stopping import StopRequested
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
        self.r = run
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
        r = self.r
        try:
            try:
                reason = self._train()
            except WorkerDied as err:
                path = r.save()  # nothing lost: the run continues from here
                raise WorkerDied(f"{err}; final checkpoint {path}; continue with resume={r.run_dir}") from None
            finished_by = r.stopper.finished_by(reason)
            if finished_by in ("signal", "preempted"):  # first: a scheduler's kill follows its signal
                self.stop_checkpoint, self.saved_at_stop = r.save(), True
            r.collection.close()  # progress bar, workers, trace window: done before the final eval
            return self._finish(finished_by)
        finally:
            r.close()  # the one teardown, on every way out

    # -- the loop -------------------------------------------------------------
    def _train(self) -> str | None:
        """Collect and learn until train.total_frames (None) or a stop (its reason)."""
        r, n, cfg = self.r, self.r.counters, self.r.cfg
        loop_start = time.perf_counter()
        b = cfg.buffer
        self.progress = Progress(
            total_frames=cfg.train.total_frames, frames=n.frames, eval_every=cfg.eval.every,
            frames_per_update=cfg.env.action_repeat * b.batch_size * b.batch_length / cfg.train.train_ratio,
            enabled=cfg.logger.progress_bar,
        )
        r.collection.callback(self.progress.close)
        if not n.updates:
            log.info("filling the replay: %d agent steps before the first update", steps_before_learning(cfg))
        for batch in r.collector:
            steps = self._store(batch)
            self.progress.collected(steps * cfg.env.action_repeat)
            if self._ready_to_learn():
                if not self.warm:
                    n.timers["random_phase_s"] = time.perf_counter() - loop_start
                    if not self._warm_up():
                        return "signal"
                reason = self._pay(r.cadence.ratio.owed(steps))
                self.progress.learned(n.updates)
                if reason is not None and n.frames < cfg.train.total_frames:
                    return reason
            # Also before learning starts: collection ends at total_frames whatever happened.
            if n.frames >= cfg.train.total_frames:
                return None  # done, even where a stop came at its last updates: nothing is left to resume
            # Also while the replay fills: a stop must not wait for the warm-up's compile.
            reason = r.stopper.poll()
            if reason is not None:
                return reason
        return None

    def _pay(self, owed: int) -> str | None:
        """Make the ``owed`` updates; stop early (returning why) when the stopper says so."""
        for paid in range(owed):
            # Checked before every update: a batch can owe minutes of updates,
            # longer than a scheduler's warning before its kill.
            reason = self.r.stopper.poll(before_update=self.r.counters.updates + 1)
            if reason is not None:
                self.r.cadence.ratio.refund(owed - paid)  # still owed after a resume
                return reason
            self._update()
        return None

    def _update(self) -> None:
        """One learner update, then whatever is due after it."""
        r, n, due = self.r, self.r.counters, self.r.cadence
        switch = self.compile_switch
        switch.poll()
        start = time.perf_counter()
        # The first update's memory sizes the background compile child (it repeats an update).
        sizing = PeakGrowth(r.device) if switch.due else contextlib.nullcontext()
        with r.trace_window.update(n.updates + 1), sizing:
            with record_function("## train/sample ##"):
                sample = r.replay.sample()
            r.learner.update(sample)
        n.updates += 1
        self._feed_captured_update()
        if switch.due:
            switch.start(sizing.bytes)
        if "first_update_s" not in n.timers:
            n.timers["first_update_s"] = time.perf_counter() - r.started  # process start -> first update
        switch.after_update(time.perf_counter() - start)
        if due.sync_weights(n.updates):
            r.collector.update_policy_weights_()  # staged; published when ready, without waiting
        else:
            r.collector.publish_pending_weights()
        if due.log_due(n.updates):
            self._log()
        evaluated_last = due.eval_due.last
        evaluate_now = due.eval_due(n.updates)  # marked done in the checkpoint below
        if due.checkpoint_due(n.updates):
            r.save()  # before the evaluation: a stop during it costs no updates
        if evaluate_now and not self._evaluate():
            due.eval_due.last = evaluated_last  # stopped mid-way: the final checkpoint keeps it owed

    def _feed_captured_update(self) -> None:
        """A captured update (compile.update=captured) reads fixed device buffers: once
        it is captured (again), the replay copies every sample straight into them."""
        r = self.r
        if not isinstance(r.replay, DeliversSamplesInto):  # a CPU learner's replay: nothing to feed
            return
        buffer = r.learner.input_buffer()
        if buffer is self.replay_destination:
            return
        r.replay.deliver_into(buffer)
        self.replay_destination = buffer
        if buffer is not None:
            log.info("update %d captured in a CUDA graph: replayed from here on, samples copied into its inputs",
                     r.counters.updates)

    # -- phases ---------------------------------------------------------------
    def _store(self, batch) -> int:
        """A collector batch into the replay buffer; returns its agent steps."""
        n = self.r.counters
        with record_function("## collect/write ##"):
            steps = write(self.r.replay, batch, self.r.models.obs_key)
        self.episodes.add(batch)
        n.steps += steps
        n.frames += steps * self.r.cfg.env.action_repeat
        return steps

    def _ready_to_learn(self) -> bool:
        """The replay holds what the first update needs (the random prefill included) or,
        once learning has started (a resumed run refilling its replay), one batch of sequences;
        and some env's stream holds a whole sequence."""
        b = self.r.cfg.buffer
        needed = b.batch_size * b.batch_length if self.r.counters.updates else steps_before_learning(self.r.cfg)
        return len(self.r.replay) >= needed and self.r.replay.can_sample()

    def _warm_up(self) -> bool:
        """Compile and warm the learner on real data before the first update, or
        start compiling in the background (compile.background) and learn eager meanwhile.
        False when a stop signal came during the compile (abandoned: it has no safe point)."""
        r, n = self.r, self.r.counters
        if compiles_in_background(r.learner.compile_cfg, r.ranks):
            self.compile_switch.due = True
        else:
            if r.learner.compile_cfg.enabled:
                log.info("compiling the losses before the first update (compile.background=false)")
                self.progress.phase("compiling the losses (warm-up)")
            try:
                with r.stopper.interruptible():
                    seconds = r.learner.warmup(r.replay.sample())
            except StopRequested:
                log.info("stop requested during the compile warm-up: warm-up abandoned")
                return False
            n.timers["compile_warmup_s"] = seconds
            log.info("compile warm-up: %.1f s", seconds)
            if r.learner.compile_cfg.enabled and r.ranks.is_main:  # one writer per run dir
                r.save_compile_artifact()  # portable: compile.cache_artifact=<this file>
        self.warm = True
        n.timers["eval_s"] = 0.0
        self.throughput.begin(n.updates, n.frames)
        return True

    def _evaluate(self) -> bool:
        """Evaluate, log and record; False when a stop signal cut it short (nothing logged)."""
        r, n, c = self.r, self.r.counters, self.r.cfg
        if not r.ranks.is_main:
            return True
        start = time.perf_counter()
        result = evaluate(r.eval_env, r.eval_policy, episodes=c.eval.episodes, max_steps=c.env.max_episode_steps,
                          record=c.eval.video, acting=c.eval.policy,
                          should_stop=lambda: r.stopper.requested is not None)
        if result is None:
            log.info("stop requested during the evaluation at update %d: evaluation abandoned", n.updates)
            return False
        self.last_eval = result
        if self.progress is not None:
            self.progress.evaluated(time.perf_counter() - start, result.mean)
        r.logger.log({"frames": n.frames, "updates": n.updates,
                      return_key(c.eval.policy): result.mean, return_key(c.eval.policy, "std"): result.std,
                      "eval_episodes": len(result.returns),
                      "wall_s": time.perf_counter() - r.started})  # since this process started
        if result.frames is not None:
            r.logger.log_video(result.frames, "eval_video", n.frames)
        if r.openloop and self.warm:  # warm: replay holds whole sequences
            self._log_openloop()
        n.timers["eval_s"] += time.perf_counter() - start
        return True

    def _log_openloop(self) -> None:
        """Open-loop imagination on one replayed batch, prepared as the learner prepares it."""
        r = self.r
        batch = r.learner.prepare(r.replay.sample())  # (B, T), on the learner's device
        video = openloop_video(
            r.models, batch, context=r.cfg.eval.openloop_context, sequences=r.cfg.eval.openloop_sequences,
        )  # (T, 3*64, N*64, 3) uint8
        r.logger.log_video(video.cpu(), "openloop", r.counters.frames)

    def _log(self) -> None:
        r, n = self.r, self.r.counters
        record = {"frames": n.frames, "updates": n.updates}
        record.update(r.learner.flush_metrics())  # the one host sync of this interval
        record.update(self.throughput.overall(n.updates, n.frames, n.timers["eval_s"]))
        record.update(self.throughput.interval(n.updates, n.frames, n.timers["eval_s"]))
        record.update(self.episodes.flush())
        record["train_ratio_achieved"] = self._train_ratio_achieved()
        r.logger.log(record)
        health.stop_if_diverged(record, r.cfg.train.stop_after_nonfinite, r.save)

    def _train_ratio_achieved(self) -> float:
        """Replayed steps per agent step so far (host counters, no device sync):
        train.train_ratio as delivered. Below it by the share of steps collected
        before learning starts (the random phase, a refill after resume)."""
        b, n = self.r.cfg.buffer, self.r.counters
        return n.updates * b.batch_size * b.batch_length / max(n.steps, 1)

    # -- the end --------------------------------------------------------------
    def _finish(self, finished_by: str) -> RunResult:
        """Final checkpoint (after a stop signal: written already), and unless preempted: final eval
        (skipped after a stop signal: a deadline is near) and summary.json."""
        r, n = self.r, self.r.counters
        if finished_by == "preempted":
            # The run is not finished: the requeued job resumes it from this checkpoint (run() wrote it).
            log.info("stop requested (%s): checkpoint %s at frames=%d updates=%d",
                     r.stopper.why, self.stop_checkpoint, n.frames, n.updates)
            return RunResult(finished_by, r.run_dir, n.frames, n.updates, stopped_by=r.stopper.requested)
        rates = self.throughput.overall(n.updates, n.frames, n.timers["eval_s"])  # before the final eval
        ranks = {}
        if r.ranks.enabled:
            ranks = {"world_size": r.ranks.world_size,
                     "max_param_divergence": distributed.max_divergence(r.models.modules)}
        if finished_by == "signal":
            log.info("stopped by %s at frames=%d updates=%d", r.stopper.why, n.frames, n.updates)
        else:
            self._evaluate()
        if not self.saved_at_stop:
            r.save()
        last = self.last_eval
        result = RunResult(
            finished_by, r.run_dir, n.frames, n.updates, stopped_by=r.stopper.requested,
            wall_s=time.perf_counter() - r.started, **rates,
            train_ratio_achieved=self._train_ratio_achieved(),
            eval_policy=r.cfg.eval.policy,
            eval_return_mean=last.mean if last else None, eval_return_std=last.std if last else None,
            eval_episodes=len(last.returns) if last else 0, timers=dict(n.timers), **ranks,
        )
        r.logger.write_summary(result.to_dict())  # rank 0 only (the others' logger writes nothing)
        r.logger.log_learning_curve(n.frames)
        return result

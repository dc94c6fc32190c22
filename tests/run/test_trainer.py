"""dreamer/run/trainer.py with fake collaborators: how each way out of the loop ends
(its result, its checkpoint) and that the one teardown runs exactly once on every path."""

from __future__ import annotations

import contextlib
import signal
import time
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict

from dreamer.algos.update_paths import UpdatePath
from dreamer.config import CompileConfig
from dreamer.data.supervisor import WorkerDied
from dreamer.report.evaluation import EvalResult
from dreamer.run import checkpoint as ckpt
from dreamer.run import trainer as trainer_module
from dreamer.run.cadence import Every, Ratio
from dreamer.run.state import Cadence, Run
from dreamer.run.stopping import STOP_SIGNALS, Stopper
from dreamer.run.trainer import Trainer
from dreamer.system.distributed import Ranks
from dreamer.system.profiling import TraceWindow
from tests.support.configs import tiny_config

STEPS = 10  # agent steps per fake collector batch


class FakeCollector:
    def __init__(self, calls: Counter, batches: int, on_batch=None, make_batch=None):
        self.calls, self.batches, self.on_batch = calls, batches, on_batch or (lambda i: None)
        self.make_batch = make_batch or (lambda i: TensorDict({}, batch_size=[STEPS]))

    def __iter__(self):
        for i in range(self.batches):
            self.on_batch(i)  # may raise (a dead worker) or ask to stop
            yield self.make_batch(i)

    def update_policy_weights_(self):
        self.calls["weights"] += 1

    def publish_pending_weights(self):
        self.calls["publish"] += 1

    def shutdown(self):
        self.calls["collector.shutdown"] += 1


class FakeReplay:
    def __init__(self):
        self.size = 0

    def extend(self, steps):
        self.size += steps.shape[0]

    def __len__(self):
        return self.size

    def can_sample(self):
        return self.size > 0

    def sample(self):
        return None

    def state_dict(self):
        return {}


class FakeLearner:
    update_path = UpdatePath.LOSSES
    compile_cfg = CompileConfig()

    def __init__(self, calls: Counter, fail_at_update=None):
        self.calls, self.fail_at_update = calls, fail_at_update

    def warmup(self, sample):
        return 0.5

    def update(self, sample):
        self.calls["update"] += 1
        if self.calls["update"] == self.fail_at_update:
            raise RuntimeError("boom in an update")

    def flush_metrics(self):
        return {}

    def state_dict(self):
        return {"w": torch.zeros(1)}

    def load_state_dict(self, state):
        self.calls["learner.load"] += 1


class FakeLogger:
    def __init__(self, calls: Counter):
        self.calls, self.records, self.summary = calls, [], None

    def log(self, record):
        self.records.append(record)

    def write_summary(self, summary):
        self.summary = summary

    def log_learning_curve(self, frames):
        self.calls["learning_curve"] += 1

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass

    def close(self):
        self.calls["logger.close"] += 1

    def rewind(self, updates):
        self.calls["logger.rewind"] += 1


def fake_run(tmp_path, *, batches=6, on_batch=None, requeue=False, fail_at_update=None, make_batch=None):
    """A Run of fakes, its teardown wired as build_run wires it."""
    cfg = tiny_config()
    cfg.env.action_repeat = 1
    cfg.collector.init_random_frames = 0
    cfg.train.total_frames = batches * STEPS
    cfg.train.train_ratio = 10  # 2 x 5 replayed steps per update: one update per agent step
    cfg.logger.log_every = cfg.eval.every = 1000
    cfg.checkpoint.every = 25
    calls = Counter()
    stopper = Stopper(requeue=requeue).install()
    teardown = contextlib.ExitStack()
    teardown.callback(stopper.uninstall)
    collection = teardown.enter_context(contextlib.ExitStack())
    collection.callback(lambda: calls.update(["trace_window.finish"]))
    collector = FakeCollector(calls, batches, on_batch, make_batch)
    collection.callback(collector.shutdown)
    teardown.callback(lambda: calls.update(["eval_env.close"]))
    logger = FakeLogger(calls)
    teardown.callback(logger.close)
    run = Run(
        cfg=cfg, run_dir=tmp_path, ranks=Ranks(), device=torch.device("cpu"), started=0.0, stopper=stopper,
        models=SimpleNamespace(obs_key="observation"), learner=FakeLearner(calls, fail_at_update),
        replay=FakeReplay(), collector=collector, eval_env=None, eval_policy=None,
        cadence=Cadence(Ratio(1.0), Every(10), Every(1000), Every(1000), Every(25)), logger=logger,
        trace_window=TraceWindow(cfg.profiling), openloop=False, resumed=False, collection=collection,
        teardown=teardown,
    )
    return run, calls


@pytest.fixture(autouse=True)
def fake_evaluate(monkeypatch):
    monkeypatch.setattr(trainer_module, "evaluate", lambda *a, **k: EvalResult([1.0, 3.0]))


@pytest.fixture(autouse=True)
def handlers_restored():
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    yield
    assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == before


def torn_down_once(calls: Counter) -> bool:
    return all(calls[name] == 1 for name in
               ("collector.shutdown", "trace_window.finish", "eval_env.close", "logger.close"))


def test_a_run_to_total_frames_evaluates_checkpoints_and_summarises(tmp_path):
    run, calls = fake_run(tmp_path)
    result = Trainer(run).run()
    assert result.finished_by == "total_frames" and result.stopped_by is None
    assert (result.frames, result.updates) == (60, 60)
    # A push every 10 updates; every other update completes a push still in flight (never waits).
    assert (calls["weights"], calls["publish"]) == (6, 54)
    assert result.eval_episodes == 2 and result.eval_return_mean == 2.0  # the final eval
    assert run.logger.summary == result.to_dict() and calls["learning_curve"] == 1
    assert ckpt.load_latest(tmp_path)["counters"]["updates"] == 60
    assert torn_down_once(calls)


def test_the_log_records_the_returns_of_the_episodes_collected_since_the_last_one(tmp_path):
    """Each fake batch ends one episode (returning 10 x its index) at its last step;
    a record every 20 updates (two batches) reports those two episodes, once."""
    def batch_ending_an_episode(i):
        done = torch.zeros(STEPS, 1, dtype=torch.bool)
        done[-1] = True
        return TensorDict({"next": {"done": done, "episode_reward": torch.full((STEPS, 1), 10.0 * i),
                                    "step_count": torch.arange(1, STEPS + 1).unsqueeze(-1)}}, batch_size=[STEPS])

    run, _ = fake_run(tmp_path, make_batch=batch_ending_an_episode)
    run.cadence.log_due = Every(20)
    Trainer(run).run()
    logged = [(r["updates"], r["train_return_mean"], r["train_return_min"], r["train_episodes"],
               r["train_episode_length"]) for r in run.logger.records if "train_return_mean" in r]
    assert logged == [(20, 5.0, 0.0, 2, STEPS), (40, 25.0, 20.0, 2, STEPS), (60, 45.0, 40.0, 2, STEPS)]


def test_a_stop_signal_mid_batch_checkpoints_refunds_and_skips_the_final_eval(tmp_path):
    run, calls = fake_run(tmp_path, batches=100, on_batch=lambda i: i == 3 and run.stopper.request("SIGTERM"))
    result = Trainer(run).run()
    assert result.finished_by == "signal" and result.stopped_by == "SIGTERM"
    assert result.frames == 40 and result.updates == 30  # the 4th batch's updates were not made
    assert result.eval_episodes == 0 and run.logger.summary["stopped_by"] == "SIGTERM"
    saved = ckpt.load_latest(tmp_path)
    assert saved["counters"]["updates"] == 30 and saved["cadence"]["ratio"]["credit"] >= STEPS  # still owed
    assert torn_down_once(calls)


def test_under_a_requeueing_scheduler_a_signal_checkpoints_and_hands_back(tmp_path):
    run, calls = fake_run(tmp_path, batches=100, requeue=True,
                          on_batch=lambda i: i == 3 and run.stopper.request("SIGUSR1"))
    result = Trainer(run).run()
    assert result.preempted and result.to_dict() == {
        "preempted": True, "run_dir": str(tmp_path), "frames": 40, "updates": 30,
        "stopped_by": "SIGUSR1", "finished_by": "preempted"}
    assert run.logger.summary is None and calls["learning_curve"] == 0  # not finished: no summary
    assert ckpt.load_latest(tmp_path)["counters"]["updates"] == 30
    assert torn_down_once(calls)


def test_the_wall_clock_budget_finishes_with_a_final_eval(tmp_path):
    run, calls = fake_run(tmp_path, batches=100)
    run.stopper.limit_time(started=0.0, minutes=0.0)  # already spent
    result = Trainer(run).run()
    assert result.finished_by == "max_minutes" and result.eval_episodes == 2
    assert torn_down_once(calls)


def test_a_dead_worker_checkpoints_then_names_resume(tmp_path):
    def die(i):
        if i == 4:
            raise WorkerDied("collector worker 0 (exit code -9) died")

    run, calls = fake_run(tmp_path, batches=100, on_batch=die)
    final = rf"; final checkpoint \S+ckpt_0000000040.pt; continue with resume={tmp_path}$"
    with pytest.raises(WorkerDied, match=final):
        Trainer(run).run()
    assert torn_down_once(calls)


def test_an_exception_in_an_update_still_tears_down_once(tmp_path):
    run, calls = fake_run(tmp_path, fail_at_update=7)
    with pytest.raises(RuntimeError, match="boom in an update"):
        Trainer(run).run()
    assert torn_down_once(calls) and run.logger.summary is None


def test_the_workers_are_shut_down_before_the_final_eval(tmp_path, monkeypatch):
    run, calls = fake_run(tmp_path)
    seen = []

    def evaluate(*args, **kwargs):
        seen.append(calls["collector.shutdown"])
        return EvalResult([0.0])

    monkeypatch.setattr(trainer_module, "evaluate", evaluate)
    Trainer(run).run()
    assert seen == [1] and torn_down_once(calls)


# -- build_run: the real collaborators, in-process (no workers) -----------------------------


def _tiny_real_config():
    cfg = tiny_config()
    cfg.eval.video = False
    return cfg


def test_build_run_then_close_releases_everything_and_restores_the_handlers(tmp_path, monkeypatch):
    from dreamer.run import build

    shutdowns = Counter()
    original = build.SupervisedCollector.shutdown
    monkeypatch.setattr(build.SupervisedCollector, "shutdown",
                        lambda self: (shutdowns.update(["collector"]), original(self)))
    run = build.build_run(_tiny_real_config(), tmp_path)
    assert all(signal.getsignal(sig) == run.stopper._handle for sig in STOP_SIGNALS)
    assert (tmp_path / "config.json").exists() and run.counters.updates == 0
    run.close()
    run.close()  # once only
    assert shutdowns["collector"] == 1


def test_a_failing_build_shuts_down_what_it_built(tmp_path, monkeypatch):
    from dreamer.run import build

    shutdowns = Counter()
    original = build.SupervisedCollector.shutdown
    monkeypatch.setattr(build.SupervisedCollector, "shutdown",
                        lambda self: (shutdowns.update(["collector"]), original(self)))

    def broken_logger(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(build, "RunLogger", broken_logger)
    with pytest.raises(OSError, match="disk full"):
        build.build_run(_tiny_real_config(), tmp_path)
    assert shutdowns["collector"] == 1  # and the autouse fixture checks the handlers came back


def test_updates_still_owed_at_a_stop_are_made_after_the_resume(tmp_path):
    """The refund a stop leaves in the ratio's credit is paid by the resumed run
    (the warm-up after a resume must not drop it)."""
    run, _ = fake_run(tmp_path, batches=100, on_batch=lambda i: i == 3 and run.stopper.request("SIGTERM"))
    stopped = Trainer(run).run()
    saved = ckpt.load_latest(tmp_path)
    owed = int(saved["cadence"]["ratio"]["credit"])
    assert owed >= STEPS
    resumed, _ = fake_run(tmp_path, batches=2)  # 20 more agent steps: 20 more updates, plus what was owed
    resumed.cadence.load_state_dict(saved["cadence"])
    resumed.counters.frames, resumed.counters.steps, resumed.counters.updates = (
        stopped.frames, stopped.frames, stopped.updates)
    resumed.cfg.train.total_frames = stopped.frames + 2 * STEPS
    result = Trainer(resumed).run()
    assert result.updates == stopped.updates + 2 * STEPS + owed


def test_a_stop_while_the_replay_fills_is_acted_on_before_the_warm_up(tmp_path):
    """Collected steps short of learning (the random phase, a refill): a stop
    signal then ends the run at the next batch, not after the compile warm-up."""
    run, calls = fake_run(tmp_path, batches=100, on_batch=lambda i: i == 2 and run.stopper.request("SIGTERM"))
    run.cfg.collector.init_random_frames = 10_000  # never ready within these batches
    result = Trainer(run).run()
    assert result.finished_by == "signal" and result.frames == 3 * STEPS and result.updates == 0
    assert calls["update"] == 0 and torn_down_once(calls)


def test_without_checkpoint_replay_a_resumed_run_refills_the_buffer_before_its_first_update(tmp_path):
    """checkpoint.replay=false: the checkpoint holds no replay, so the resumed run's
    buffer starts empty and no update is made until it holds one batch of sequences
    (batch_size x batch_length steps) again; init_random_frames is not paid twice."""
    first, _ = fake_run(tmp_path, batches=3)
    assert first.cfg.checkpoint.replay is False  # the default
    Trainer(first).run()
    saved = ckpt.load_latest(tmp_path)
    assert "replay" not in saved

    resumed, calls = fake_run(tmp_path, batches=8)
    resumed.resumed = True
    resumed.restore(saved)
    assert len(resumed.replay) == 0
    resumed.cfg.buffer.batch_length = 15  # 2 x 15 = 30 steps: three batches of refill
    resumed.cfg.collector.init_random_frames = 10_000  # a fresh run would never learn within 8 batches
    resumed.cfg.train.total_frames = saved["counters"]["frames"] + 8 * STEPS
    sizes = []  # replay size at the warm-up and at each update
    resumed.learner.warmup = lambda sample: (sizes.append(("warmup", len(resumed.replay))), 0.5)[1]
    update = resumed.learner.update
    resumed.learner.update = lambda sample: (sizes.append(("update", len(resumed.replay))), update(sample))
    result = Trainer(resumed).run()
    assert sizes[0] == ("warmup", 30) and min(size for _, size in sizes) == 30
    assert calls["update"] > 0 and result.updates == saved["counters"]["updates"] + calls["update"]


def test_past_collector_max_restarts_the_run_ends_with_a_checkpoint_and_one_error_line(tmp_path, capsys):
    """collector.max_restarts: every rebuilt collector's worker dies too; after that many
    restarts the run stops, checkpointed, with one `error:` line (exit 2) naming the limit."""
    from dreamer.__main__ import one_line_on_user_error
    from dreamer.data.supervisor import WORKER_DIED, SupervisedCollector

    run, calls = fake_run(tmp_path, batches=100)
    builds = []

    def die(i):
        if i == 2:
            raise RuntimeError(f"{WORKER_DIED}: worker 0 (exit code -9). Terminating the others.")

    def build(collected):
        builds.append(collected)
        return FakeCollector(calls, 100, die)

    run.collector = SupervisedCollector(build, restart=True, max_restarts=2)
    run.cfg.collector.max_restarts = 2
    run.cfg.logger.progress_bar = False  # stderr: the error line alone
    with pytest.raises(SystemExit) as exit_info, one_line_on_user_error():
        Trainer(run).run()
    assert exit_info.value.code == 2
    # The first collector and max_restarts rebuilds, no more; each told the agent steps delivered
    # before it (what a rebuild during the random prefill subtracts from the random steps owed).
    per_collector = run.counters.steps // 3
    assert builds == [0, per_collector, 2 * per_collector] and per_collector > 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    newest = ckpt.load_latest(tmp_path)
    assert newest["counters"]["frames"] == 3 * 2 * STEPS  # every batch collected is in it
    assert err == [f"error: collector worker 0 (exit code -9) died after 2 restarts (collector.max_restarts=2); "
                   f"check the env for crashes; final checkpoint {newest['path']}; continue with resume={tmp_path}"]
    assert calls["trace_window.finish"] == 1 and calls["logger.close"] == 1


def test_a_run_that_ends_before_learning_starts_reports_no_throughput(tmp_path):
    run, calls = fake_run(tmp_path, batches=3)
    run.cfg.collector.init_random_frames = 10**6  # the replay never fills: no update, no steady phase
    result = Trainer(run).run()
    assert result.updates == 0 and calls["update"] == 0
    # Was frames / 1e-9 s (billions of frames/s) once the final eval's time exceeded the phase's.
    assert result.updates_per_s == 0.0 and result.frames_per_s == 0.0


def test_each_record_rates_its_own_interval_so_a_slowdown_shows_at_once(tmp_path, monkeypatch):
    """Updates 1-40 take no time, 41-60 take 20 ms each: the record at 60 says ~50 updates/s
    for its interval while the cumulative rate still averages the fast start in (a run that
    slowed after 14 minutes hid so in its cumulative figure)."""
    run, calls = fake_run(tmp_path)
    run.cadence.log_due = Every(20)
    fast_update = run.learner.update

    def slowing_update(sample):
        fast_update(sample)
        if calls["update"] > 40:
            time.sleep(0.02)

    monkeypatch.setattr(run.learner, "update", slowing_update)
    Trainer(run).run()
    records = {r["updates"]: r for r in run.logger.records if "updates_per_s_interval" in r}
    assert sorted(records) == [20, 40, 60]
    last = records[60]
    assert 20 < last["updates_per_s_interval"] < 55  # 20 updates in >= 0.4 s
    assert last["updates_per_s"] > 1.4 * last["updates_per_s_interval"]  # 60 updates in about the same time
    assert records[20]["updates_per_s_interval"] > 200 and records[40]["updates_per_s_interval"] > 200
    assert last["frames_per_s_interval"] == pytest.approx(last["updates_per_s_interval"])  # one update per step

"""Every phase of the loop obeys a stop in bounded time, and what it leaves resumes correctly
(issue 45 items 1, 6, 7, 11): the trainer with fake collaborators (tests/run/test_trainer.py's)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from dreamer.report.evaluation import EvalResult
from dreamer.run import checkpoint as ckpt
from dreamer.run import trainer as trainer_module
from dreamer.run.cadence import Every
from dreamer.run.stopping import STOP_SIGNALS
from dreamer.run.trainer import Trainer
from tests.run.test_trainer import STEPS, fake_run, torn_down_once


@pytest.fixture(autouse=True)
def fake_evaluate(monkeypatch):
    monkeypatch.setattr(trainer_module, "evaluate", lambda *a, **k: EvalResult([1.0]))


@pytest.fixture(autouse=True)
def handlers_restored():
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    yield
    assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == before


def _evaluations(run) -> list[int]:
    return [r["updates"] for r in run.logger.records if "eval_sample_return_mean" in r]


# -- item 1: a run that cannot learn still ends ---------------------------------------------


def test_collection_stops_at_total_frames_even_where_learning_never_started(tmp_path):
    """The loop checked total_frames only after an update: a replay that never filled collected forever."""
    run, calls = fake_run(tmp_path, batches=1000)
    run.cfg.collector.init_random_frames = 10**6  # never ready
    run.cfg.train.total_frames = 5 * STEPS
    result = Trainer(run).run()
    assert result.finished_by == "total_frames" and result.frames == 5 * STEPS and result.updates == 0
    assert torn_down_once(calls)


# -- item 7: evaluation and checkpoint at the same update; a stop during evaluation ----------


def test_a_checkpoint_due_at_an_evaluations_update_is_written_before_it(tmp_path, monkeypatch):
    run, _ = fake_run(tmp_path)
    run.cadence.eval_due = Every(25)  # checkpoint.every is 25 too
    checkpointed_at_eval = []

    def evaluate(*args, **kwargs):
        checkpointed_at_eval.append(max((int(p.stem.split("_")[1]) for p in ckpt.list_checkpoints(tmp_path)),
                                        default=0))
        return EvalResult([1.0])

    monkeypatch.setattr(trainer_module, "evaluate", evaluate)
    Trainer(run).run()
    assert _evaluations(run) == [25, 50, 60]
    assert checkpointed_at_eval == [25, 50, 50]  # the final eval comes before the final checkpoint


def _evaluate_until_stopped(run):
    """An evaluation that a stop signal reaches after some steps: it polls should_stop as the real one does."""
    def evaluate(*args, should_stop, **kwargs):
        for step in range(10_000):
            if step == 3:
                run.stopper.request("SIGTERM")
            if should_stop():
                return None
        raise AssertionError("the evaluation never asked whether to stop")
    return evaluate


def test_a_stop_during_an_evaluation_ends_it_and_the_resumed_run_evaluates_first(tmp_path, monkeypatch):
    run, calls = fake_run(tmp_path, batches=100)
    run.cadence.eval_due = Every(25)
    monkeypatch.setattr(trainer_module, "evaluate", _evaluate_until_stopped(run))
    result = Trainer(run).run()
    assert result.finished_by == "signal" and result.updates == 25 and result.eval_episodes == 0
    assert _evaluations(run) == []  # nothing of the abandoned evaluation was logged
    saved = ckpt.load_latest(tmp_path)
    assert saved["counters"]["updates"] == 25 and saved["cadence"]["eval_due"]["last"] == 0  # still owed
    assert torn_down_once(calls)

    resumed, _ = fake_run(tmp_path, batches=2)
    resumed.cadence.eval_due = Every(25)
    resumed.resumed = True
    resumed.restore(saved)
    resumed.cfg.train.total_frames = saved["counters"]["frames"] + 2 * STEPS
    monkeypatch.setattr(trainer_module, "evaluate", lambda *a, **k: EvalResult([1.0]))
    Trainer(resumed).run()
    assert _evaluations(resumed)[0] == 26  # the owed evaluation, at the resumed run's first update


def test_the_final_evaluation_obeys_a_stop_and_the_run_still_checkpoints(tmp_path, monkeypatch):
    run, _ = fake_run(tmp_path)
    monkeypatch.setattr(trainer_module, "evaluate", _evaluate_until_stopped(run))
    result = Trainer(run).run()
    assert result.finished_by == "total_frames" and result.stopped_by == "SIGTERM" and result.eval_episodes == 0
    assert ckpt.load_latest(tmp_path)["counters"]["updates"] == 60


def test_a_stop_at_the_last_updates_finishes_the_run_rather_than_handing_it_back(tmp_path):
    """Under a requeueing scheduler a stop during the last batch's updates would hand back a
    run that has nothing left to do (its requeued job would then be a finished run's resume)."""
    run, _ = fake_run(tmp_path, requeue=True,
                      on_batch=lambda i: i == 5 and run.stopper.request("SIGUSR1"))  # the last batch
    result = Trainer(run).run()
    assert result.finished_by == "total_frames" and not result.preempted and run.logger.summary is not None


# -- item 7: the foreground compile warm-up ---------------------------------------------------


def test_a_stop_signal_during_the_compile_warm_up_ends_it_at_once_with_a_checkpoint(tmp_path):
    """compile.background=false: the warm-up compiles for minutes with no safe point; a SIGTERM
    abandons it (it makes no optimiser step) and the run checkpoints within seconds."""
    run, calls = fake_run(tmp_path, batches=100)

    def compiling_for_a_long_time(sample):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.01)  # a compiler's Python, between C calls
        return 60.0

    run.learner.warmup = compiling_for_a_long_time
    signal_at = []

    def send_sigterm():
        signal_at.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Timer(0.5, send_sigterm).start()
    result = Trainer(run).run()
    latency = time.monotonic() - signal_at[0]
    assert result.finished_by == "signal" and result.updates == 0 and calls["update"] == 0
    assert latency < 5, f"the warm-up ignored the stop for {latency:.1f} s"
    assert ckpt.load_latest(tmp_path)["counters"]["frames"] == result.frames


# -- item 6: a stop during the random prefill ---------------------------------------------------


def test_a_run_stopped_during_the_prefill_waits_for_the_whole_prefill_after_its_resume(tmp_path):
    """The checkpoint written before the first update resumed as if learning had started: it
    learned from the first batch of sequences, on the untrained policy's data."""
    first, _ = fake_run(tmp_path, batches=100, on_batch=lambda i: i == 2 and first.stopper.request("SIGTERM"))
    first.cfg.collector.init_random_frames = 60
    Trainer(first).run()
    saved = ckpt.load_latest(tmp_path)
    assert saved["counters"]["updates"] == 0 and saved["counters"]["steps"] == 3 * STEPS

    resumed, _ = fake_run(tmp_path, batches=10)
    resumed.cfg.collector.init_random_frames = 60
    resumed.resumed = True
    resumed.restore(saved)  # checkpoint.replay=false: the replay starts empty
    resumed.cfg.train.total_frames = saved["counters"]["frames"] + 10 * STEPS
    sizes = []
    update = resumed.learner.update
    resumed.learner.update = lambda sample: (sizes.append(len(resumed.replay)), update(sample))
    Trainer(resumed).run()
    assert sizes and min(sizes) >= 60  # not before the replay holds the whole prefill again


@pytest.mark.parametrize("state, left", [
    (None, 100),  # a fresh run
    ({"counters": {"updates": 0, "steps": 30}}, 100),  # stopped in the prefill, its random steps not saved
    ({"counters": {"updates": 0, "steps": 30}, "replay": {}}, 70),  # ... and saved (checkpoint.replay)
    ({"counters": {"updates": 0, "steps": 130}, "replay": {}}, 0),
    ({"counters": {"updates": 5, "steps": 30}}, 0),  # learning had started: the policy acts
])
def test_random_frames_owed_after_a_resume(state, left):
    from dreamer.run.state import random_frames_left

    assert random_frames_left(100, state) == left


@pytest.mark.parametrize("requeue", [False, True], ids=["stopped", "preempted"])
def test_a_stop_signals_checkpoint_is_written_before_the_workers_shut_down(tmp_path, requeue):
    """Shutting the workers down takes seconds of a scheduler's warning: the checkpoint comes first, once."""
    run, calls = fake_run(tmp_path, batches=100, requeue=requeue,
                          on_batch=lambda i: i == 3 and run.stopper.request("SIGTERM"))
    final = "ckpt_0000000030.pt"
    at_shutdown = []
    run.collection.callback(lambda: at_shutdown.append([p.name for p in ckpt.list_checkpoints(tmp_path)]))
    saves = []
    save = run.save
    run.save = lambda: (saves.append(run.counters.updates), save())[1]
    result = Trainer(run).run()
    assert result.updates == 30 and final in at_shutdown[0]
    assert saves == [25, 30]  # the periodic one and the stop's, not a second final one
    assert torn_down_once(calls)

"""A SIGTERM in any phase ends `python -m dreamer` with a checkpoint within seconds (issue 45
item 7): during the random prefill, during an evaluation (which now follows the checkpoint due
at its update) and during the foreground compile warm-up."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from dreamer.run import checkpoint as ckpt
from tests.support.processes import FAST, read_metrics, start, wait_for

STOP_WITHIN_S = 30  # a scheduler's warning before its kill (SLURM's KillWait defaults to 30 s)
ENDLESS = "train.total_frames=100000"


def _log(run_dir: Path) -> str:
    path = run_dir / "dreamer.log"
    return path.read_text() if path.is_file() else ""


def _sigterm_then_wait(proc) -> float:
    """Seconds from SIGTERM to the process's exit (status 0 expected)."""
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    latency = time.monotonic() - sent
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    return latency


@pytest.mark.timeout(300)
def test_a_sigterm_during_the_prefill_checkpoints_at_once(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(*FAST, "collector.init_random_frames=1500", "buffer.capacity=2000", ENDLESS,
                 f"hydra.run.dir={run_dir}")
    try:
        wait_for(lambda: "filling the replay: 1500 agent steps" in _log(run_dir), 180, "the prefill")
        time.sleep(1.0)
        latency = _sigterm_then_wait(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert latency < STOP_WITHIN_S, f"{latency:.1f} s"
    saved = ckpt.load_latest(run_dir)
    assert saved["counters"]["updates"] == 0 and 0 < saved["counters"]["steps"] < 1500


@pytest.mark.timeout(300)
def test_a_sigterm_during_an_evaluation_abandons_it_after_the_checkpoint_it_follows(tmp_path):
    """The evaluation ran before the checkpoint due at its update, and ignored a stop until its
    episodes were done: a scheduler's short warning during it lost the checkpoint interval."""
    run_dir = tmp_path / "run"
    proc = start(*FAST, "eval.every=20", "checkpoint.every=20", "eval.episodes=64", ENDLESS,
                 f"hydra.run.dir={run_dir}")
    try:
        wait_for(lambda: (run_dir / "checkpoints" / "ckpt_0000000020.pt").is_file(), 240, "the checkpoint at 20")
        latency = _sigterm_then_wait(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert latency < STOP_WITHIN_S, f"{latency:.1f} s"
    assert "evaluation abandoned" in _log(run_dir)
    assert not [m for m in read_metrics(run_dir) if "eval_sample_return_mean" in m]  # nothing half-done was logged
    saved = ckpt.load_latest(run_dir)
    assert saved["counters"]["updates"] == 20 and saved["cadence"]["eval_due"]["last"] == 0  # still owed


@pytest.mark.timeout(400)
def test_a_sigterm_during_the_compile_warm_up_checkpoints_without_waiting_for_the_compile(tmp_path):
    run_dir = tmp_path / "run"
    proc = start("experiment=smoke", "compile.background=false", "eval.video=false", "logger.progress_bar=false",
                 "collector.num_workers=0", "threads=1", ENDLESS, f"hydra.run.dir={run_dir}",
                 f"compile.cache_dir={tmp_path / 'inductor'}")  # a cold compile
    try:
        wait_for(lambda: "compiling the losses before the first update" in _log(run_dir), 240, "the warm-up")
        time.sleep(2.0)
        latency = _sigterm_then_wait(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert latency < STOP_WITHIN_S, f"{latency:.1f} s"
    assert "warm-up abandoned" in _log(run_dir)
    assert ckpt.load_latest(run_dir)["counters"]["updates"] == 0

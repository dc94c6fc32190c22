"""A collector worker that dies: noticed within seconds, restarted or reported, never a hang."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from dreamer.run import checkpoint as ckpt
from tests.support.processes import FAST_WITH_WORKER, alive, has_updates, start, wait_for, worker_pids


def _kill_a_worker(run_dir, proc) -> tuple[int, float]:
    wait_for(has_updates(run_dir), 180, "the first updates")
    [worker] = worker_pids(proc.pid)
    os.kill(worker, signal.SIGKILL)  # as the OOM killer would
    return worker, time.monotonic()


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_a_dead_worker_is_restarted_and_the_run_finishes(tmp_path):
    run_dir = tmp_path / "run"
    # The kill comes after the first logged updates (~250 frames): the rest needs the new worker.
    proc = start(*FAST_WITH_WORKER, f"hydra.run.dir={run_dir}", "train.total_frames=400")
    dead, _ = _kill_a_worker(run_dir, proc)
    wait_for(lambda: worker_pids(proc.pid) not in ([], [dead]), 30, "a replacement worker")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert "collector worker 0 (exit code -9) died; restarting the collector (1/3)" in out + err
    assert json.loads((run_dir / "summary.json").read_text())["frames"] >= 400
    assert not alive([dead])


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_a_dead_worker_without_restart_stops_with_one_clear_line_and_a_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(*FAST_WITH_WORKER, f"hydra.run.dir={run_dir}", "train.total_frames=100000",
                 "collector.restart_on_failure=false")
    _, killed_at = _kill_a_worker(run_dir, proc)
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - killed_at < 30
    assert proc.returncode == 2
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert last.startswith("error: collector worker 0 (exit code -9) died and collector.restart_on_failure=false")
    newest = ckpt.load_latest(run_dir)
    assert f"final checkpoint {newest['path']}; continue with resume={run_dir}" in last
    assert "Traceback" not in err

"""Stop signals end to end: a final checkpoint, exit 0, no worker left behind."""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest

from dreamer.run import checkpoint as ckpt
from tests.support.processes import FAST_WITH_WORKER, alive, descendants, has_updates, start, wait_for


@pytest.mark.e2e
@pytest.mark.timeout(600)
@pytest.mark.parametrize("sig, whole_group", [
    (signal.SIGTERM, False),  # a scheduler's preemption notice to the main process
    (signal.SIGINT, True),  # Ctrl-C in a terminal: the whole process group gets it
])  # SIGUSR1 (SLURM's --signal=USR1@60) runs the same handler: tests/e2e/test_batch_jobs.py sends it
def test_a_stop_signal_writes_a_final_checkpoint_and_exits_0(tmp_path, sig, whole_group):
    run_dir = tmp_path / "run"
    # 400 agent steps per batch owe 100 updates (one per four steps): a stop must
    # not wait for them all (a scheduler's warning may be shorter).
    proc = start(*FAST_WITH_WORKER, f"hydra.run.dir={run_dir}", "train.total_frames=100000",
                 "collector.frames_per_batch=400")
    wait_for(has_updates(run_dir), 180, "the first updates")
    children = descendants(proc.pid)
    assert children, "the run has collector workers"
    if whole_group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    # How soon it stops is not timed (that depends on the machine): it must not make the
    # batch's owed updates first, which the credit left in the checkpoint shows below.
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped_by"] == signal.Signals(sig).name
    newest = ckpt.load_latest(run_dir)
    assert newest["counters"]["updates"] == summary["updates"]  # the final checkpoint is the stop point
    assert newest["counters"]["frames"] == summary["frames"]
    # It left mid-batch, and the updates it did not make are still owed on resume.
    assert newest["cadence"]["ratio"]["credit"] >= 1
    wait_for(lambda: not alive(children), 10, f"workers {children} to exit")


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_a_second_ctrl_c_exits_at_once_without_leaving_workers(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(*FAST_WITH_WORKER, f"hydra.run.dir={run_dir}", "train.total_frames=100000")
    wait_for(has_updates(run_dir), 180, "the first updates")
    children = descendants(proc.pid)
    lines = []  # its stderr, read as it comes
    readers = [threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True),
               threading.Thread(target=proc.stdout.read, daemon=True)]  # a full pipe would block it
    for reader in readers:
        reader.start()
    os.killpg(proc.pid, signal.SIGINT)
    # Two signals sent close together can arrive as one: the second keypress comes
    # once the first has been handled (its handler printed its line), however loaded the machine.
    wait_for(lambda: any("SIGINT: stopping after this step" in line for line in lines), 120,
             "the first SIGINT's handler")
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=60)
    for reader in readers:
        reader.join(timeout=10)
    err = "".join(lines)
    assert proc.returncode == 130, err[-3000:]
    assert "second SIGINT: exiting now" in err
    wait_for(lambda: not alive(children), 10, f"workers {children} to exit")


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_workers_exit_when_the_main_process_is_killed(tmp_path):
    run_dir = tmp_path / "run"
    proc = start(*FAST_WITH_WORKER, f"hydra.run.dir={run_dir}", "train.total_frames=100000")
    wait_for(has_updates(run_dir), 180, "the first updates")
    children = descendants(proc.pid)
    assert children
    proc.kill()  # SIGKILL: no handler runs, no shutdown code
    proc.communicate(timeout=15)
    wait_for(lambda: not alive(children), 30, f"orphaned workers {children} to exit")

"""Hydra multirun, as a user at the terminal: `python -m dreamer -m seed=0,1 ...`, then a
plot; and the cluster path (hydra-submitit-launcher) on this machine through submitit_local."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil

from tests.support.processes import ROOT, run_dreamer

# Collected in the learner's process (no worker to spawn; one learner thread, as beside a
# worker: two OpenMP threads on a busy 2-core box wait on each other): these tests are about
# launchers, signals and requeues; workers under signals are tests/run/test_signals.py's.
TINY = ["experiment=smoke", "compile=off", "collector.num_workers=0", "threads=1", "train.total_frames=250",
        "eval.video=false", "logger.progress_bar=false", "checkpoint.every=1000"]
# From Pendulum's state vector where observations do not matter (no rendering, no convolutions).
TINY_STATES = [*TINY, "env=pendulum"]
# A job signalled after its first logged updates (about 200 frames) still owes frames to its requeued run.
REQUEUED_FRAMES = 400


def test_multirun_over_seeds_then_plot_the_runs(tmp_path):
    sweep = tmp_path / "sweep"
    env = {**os.environ, "SDL_VIDEODRIVER": "dummy", "PYTHONPATH": str(ROOT)}
    result = run_dreamer("-m", "seed=0,1", *TINY_STATES, f"hydra.sweep.dir={sweep}")
    assert result.returncode == 0, result.stderr[-3000:]
    for job, seed in (("0", 0), ("1", 1)):
        assert json.loads((sweep / job / "config.json").read_text())["seed"] == seed
        assert json.loads((sweep / job / "summary.json").read_text())["frames"] >= 250
    out = tmp_path / "seeds.png"
    plot = subprocess.run([sys.executable, str(ROOT / "scripts" / "plot_runs.py"), str(sweep), "--out", str(out)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert plot.returncode == 0, plot.stderr
    assert plot.stdout.strip() == f"{out}: 2 runs" and out.stat().st_size > 0


def _job_process(launcher: subprocess.Popen, timeout: float = 120):
    """The submitit task process (the one running the train loop) under ``launcher``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in psutil.Process(launcher.pid).children(recursive=True):
            try:
                if "submitit.core._submit" in " ".join(child.cmdline()):
                    return child
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.5)
    raise AssertionError("no submitit job process appeared")


def test_submitit_local_job_checkpoints_on_sigusr1_requeues_and_resumes(tmp_path):
    sweep = tmp_path / "sweep"
    run_dir = sweep / "0"
    env = {**os.environ, "SDL_VIDEODRIVER": "dummy", "PYTHONPATH": str(ROOT)}
    launcher = subprocess.Popen(
        [sys.executable, "-m", "dreamer", "-m", "hydra/launcher=submitit_local", "seed=0",
         *TINY_STATES, f"train.total_frames={REQUEUED_FRAMES}", f"hydra.sweep.dir={sweep}"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        stdin=subprocess.DEVNULL,
    )
    try:
        job = _job_process(launcher)
        # Signal once the learner is training (metrics are logged every 10 updates).
        deadline = time.monotonic() + 300
        while not ((run_dir / "metrics.jsonl").exists() and (run_dir / "metrics.jsonl").read_text().count("\n") >= 2):
            assert time.monotonic() < deadline and launcher.poll() is None, "the job never started training"
            time.sleep(0.5)
        job.send_signal(signal.SIGUSR1)
        output, _ = launcher.communicate(timeout=600)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, output[-3000:]
    log = (run_dir / "dreamer.log").read_text()
    stop = re.search(r"stop requested \(SIGUSR1\): checkpoint \S+ at frames=(\d+) updates=(\d+)", log)
    assert stop, log[-3000:]
    frames, updates = stop.groups()
    assert f"resumed from {run_dir} at frames={frames} updates={updates}" in log
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["frames"] >= REQUEUED_FRAMES and summary["updates"] > int(updates)


def test_sbatch_script_checkpoints_on_usr1_requeues_and_the_requeued_job_resumes(tmp_path):
    """scripts/sbatch_dreamer.sh with a stand-in `scontrol` that records the requeue."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'scontrol.calls'}\n")
    scontrol.chmod(0o755)
    run_dir = tmp_path / "run"
    env = {**os.environ, "SDL_VIDEODRIVER": "dummy", "PYTHONPATH": str(ROOT), "PYTHON": sys.executable,
           "SLURM_JOB_ID": "4242", "RUN_DIR": str(run_dir), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    command = ["bash", str(ROOT / "scripts" / "sbatch_dreamer.sh"), *TINY_STATES,
               f"train.total_frames={REQUEUED_FRAMES}"]

    first = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not ((run_dir / "metrics.jsonl").exists() and (run_dir / "metrics.jsonl").read_text().count("\n") >= 2):
            assert time.monotonic() < deadline and first.poll() is None, "the job never started training"
            time.sleep(0.5)
        first.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@120 does
        output, _ = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, output[-3000:]
    assert (tmp_path / "scontrol.calls").read_text().split() == ["requeue", "4242"]
    assert list((run_dir / "checkpoints").glob("ckpt_*.pt")) and not (run_dir / "summary.json").exists()

    second = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                            stdin=subprocess.DEVNULL)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resuming {run_dir}" in second.stdout
    assert f"resumed from {run_dir}" in (run_dir / "dreamer.log").read_text()
    assert json.loads((run_dir / "summary.json").read_text())["frames"] >= REQUEUED_FRAMES
    assert (tmp_path / "scontrol.calls").read_text().split() == ["requeue", "4242"]  # not requeued again


def test_a_two_task_submitit_job_is_one_data_parallel_run(tmp_path):
    """hydra.launcher.tasks_per_node=2 (as on a SLURM node with 2 GPUs): the tasks join one
    process group (gloo on CPU), write one run directory and stay in lockstep."""
    sweep = tmp_path / "sweep"
    env = {**os.environ, "SDL_VIDEODRIVER": "dummy", "PYTHONPATH": str(ROOT)}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    result = subprocess.run(
        [sys.executable, "-m", "dreamer", "-m", "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2",
         *TINY_STATES, "device=cpu", f"hydra.sweep.dir={sweep}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir() and not p.name.startswith(".")) == ["0"]  # one run
    summary = json.loads((sweep / "0" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["max_param_divergence"] == 0.0
    assert summary["frames"] >= 250

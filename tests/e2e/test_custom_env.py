"""End to end: a user's own gymnasium env, registered in their module, trained with
`python -m dreamer env=gym env.name=ID env.import=MODULE`; and the achieved train
ratio that run logs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.custom_env import write_custom_env_module
from tests.support.processes import FAST_TRAIN_RATIO, FAST_WITH_WORKER, ROOT, dreamer_env, read_metrics

MODULE, ENV_ID = "my_dreamer_envs", "MyDrift-v0"
BATCH_SIZE, BATCH_LENGTH, TRAIN_RATIO = 4, 10, FAST_TRAIN_RATIO  # experiment=smoke's batches


@pytest.fixture(scope="module")
def custom_env_run(tmp_path_factory) -> tuple[Path, int, list[int]]:
    """(run dir, pid of `python -m dreamer`, pids of every process that built the env)."""
    tmp = tmp_path_factory.mktemp("custom_env")
    (tmp / "src").mkdir()
    write_custom_env_module(tmp / "src", MODULE, ENV_ID)
    built_by, run_dir = tmp / "built_by.txt", tmp / "run"
    env = dreamer_env()
    # Importable only through the user's PYTHONPATH, as their own package would be.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp / "src"), env.get("PYTHONPATH")]))
    env["CUSTOM_ENV_BUILT_BY"] = str(built_by)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dreamer", *FAST_WITH_WORKER, "env=gym", f"env.name={ENV_ID}", f"env.import={MODULE}",
         "train.total_frames=250", f"hydra.run.dir={run_dir}"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
    )
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    return run_dir, proc.pid, [int(line) for line in built_by.read_text().split()]


def test_a_custom_env_trains_through_a_spawned_collector_worker(custom_env_run):
    run_dir, main_pid, built_by = custom_env_run
    assert main_pid in built_by  # the env check, model shapes and evaluation
    workers = set(built_by) - {main_pid}
    assert workers, "no collector worker built the env: env.import must reach spawned workers"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["frames"] >= 250 and summary["updates"] > 0
    assert json.loads((run_dir / "config.json").read_text())["env"]["import"] == MODULE


def test_metrics_log_the_train_ratio_achieved(custom_env_run):
    run_dir, _, _ = custom_env_run
    logged = [m for m in read_metrics(run_dir) if "train_ratio_achieved" in m]
    assert len(logged) >= 3
    for m in logged:  # replayed steps per agent step so far (action repeat 1: agent steps = frames)
        assert m["train_ratio_achieved"] == pytest.approx(m["updates"] * BATCH_SIZE * BATCH_LENGTH / m["frames"])
    # Below the target only by the random-phase share (100 of the run's 250+ agent steps).
    final = json.loads((run_dir / "summary.json").read_text())["train_ratio_achieved"]
    assert 0.5 * TRAIN_RATIO <= final <= TRAIN_RATIO

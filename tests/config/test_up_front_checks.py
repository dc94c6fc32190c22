"""Inputs that ended in a traceback (or ran without ever learning) are one line before Hydra
creates the run directory (dreamer/check.py, dreamer/run/preflight.py; issue 45 items 1 and 11)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest

from dreamer.check import check_command_line
from dreamer.errors import UserError


@contextlib.contextmanager
def read_only(path: Path):
    """``path`` unwritable for this process, root included (an immutable directory)."""
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is not available here: root cannot be kept from writing a directory")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(path)], check=True)
    else:
        path.chmod(0o555)
        try:
            yield
        finally:
            path.chmod(0o755)


@pytest.mark.parametrize("overrides, message", [
    (["algo=dreamer_v3", "algo.gamma=1"], "algo.gamma=1.0 must be in (0, 1)"),
    (["algo=dreamer_v3", "algo.gamma=1.5"], "algo.gamma=1.5 must be in (0, 1)"),
    (["algo=dreamer_v3", "algo.lmbda=-0.5"], "algo.lmbda=-0.5 must be in [0.0, 1.0]"),
    (["seed=-1"], "seed=-1 must be in [0, 2147483647]"),
    (["buffer.batch_size=0"], "buffer.batch_size=0 must be > 0"),
    (["env.sticky_action_prob=2"], "env.sticky_action_prob=2.0 must be in [0.0, 1.0]"),
    (["experiment=smoke", "buffer.capacity=50"], "buffer.capacity=50 cannot hold what the first update needs"),
    (["experiment=smoke", "train.total_frames=150"], "train.total_frames=150 ends before learning starts"),
])
def test_a_bad_value_is_one_line_before_the_run_directory_exists(overrides, message, tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(UserError) as err:
        check_command_line([*overrides, f"hydra.run.dir={run_dir}"])
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    assert not run_dir.exists()


def test_sequences_longer_than_every_episode_pass(tmp_path):
    """Sequences run across episode ends: CartPole's registered limit (500 env steps, 63 agent
    steps at action repeat 8) does not bound buffer.batch_length."""
    check_command_line(["env.name=CartPole-v1", "env.action_repeat=8", "buffer.batch_length=64",
                        f"hydra.run.dir={tmp_path / 'run'}"])


def test_resuming_a_directory_that_cannot_be_written_is_one_line(tmp_path):
    """It was a PermissionError traceback at the first record the resumed run rewrote."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with read_only(run_dir), pytest.raises(UserError) as err:
        check_command_line([f"resume={run_dir}", f"hydra.run.dir={tmp_path / 'out'}"])
    assert str(err.value).startswith(f"resume={run_dir} cannot be written (") and "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


CLASSIC_CONTROL = ("CartPole-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0", "Pendulum-v1")


@pytest.mark.parametrize("preset", ["small", "gym_state_v3"])
@pytest.mark.parametrize("task", [*(("env=gym", f"env.name={name}") for name in CLASSIC_CONTROL),
                                  ("env=dmc_proprio", "env.name=walker-walk"),
                                  ("env=dmc_proprio", "env.name=cartpole-swingup")],
                         ids=lambda task: task[-1].partition("=")[2])
def test_one_set_of_hyperparameters_runs_any_classic_control_or_dmc_task(preset, task, tmp_path):
    """Issue 55: the presets take any gymnasium classic-control or DMC (proprio) task with only
    env= and env.name= changed, whatever its episodes' lengths (CartPole's random ones last
    ~22 steps, gym_state_v3's sequences 64): the run's checks, this machine's included, pass."""
    checked = check_command_line([f"experiment={preset}", *task, f"hydra.run.dir={tmp_path / 'run'}"])
    assert checked is not None and checked.jobs[0][1].cfg.experiment == preset

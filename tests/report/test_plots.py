"""dreamer/report/plots.py and scripts/plot_runs.py: curves over seeds, from run directories."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from dreamer.errors import UserError
from dreamer.report.plots import find_runs, load_run, mean_std
from tests.support.paths import REPO_ROOT


def fake_run(path, seed, returns, frames=(100, 200, 300), model=None, return_key="eval_sample_return_mean"):
    path.mkdir(parents=True)
    config = {"experiment": "smoke", "seed": seed, "env": {"name": "Pendulum-v1"}, "model": model}
    (path / "config.json").write_text(json.dumps(config))
    lines = []
    for f, r in zip(frames, returns):
        lines.append({"frames": f, "updates": f // 10, "updates_per_s": 10.0 + seed})
        lines.append({"frames": f, "updates": f // 10, return_key: r, "wall_s": f / 10})
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_mean_and_std_over_seeds_on_a_common_frame_grid():
    x, mean, std = mean_std([np.array([0.0, 100.0]), np.array([0.0, 50.0, 100.0])],
                            [np.array([0.0, 10.0]), np.array([2.0, 4.0, 6.0])])
    assert list(x) == [0, 50, 100]
    # At 50 frames the first run is interpolated to 5.
    assert np.allclose(mean, [1.0, 4.5, 8.0]) and np.allclose(std, [1.0, 0.5, 2.0])


def test_a_run_shorter_than_the_others_only_counts_where_it_has_data():
    x, mean, std = mean_std([np.array([0.0, 100.0]), np.array([0.0, 200.0])],
                            [np.array([0.0, 10.0]), np.array([0.0, 20.0])])
    assert list(x) == [0, 100, 200] and mean[-1] == 20.0 and std[-1] == 0.0


def test_a_sweep_directory_expands_to_its_runs(tmp_path):
    for seed in range(3):
        fake_run(tmp_path / "sweep" / str(seed), seed, [seed, seed, seed])
    runs = find_runs([tmp_path / "sweep"])
    assert [p.name for p in runs] == ["0", "1", "2"]
    assert load_run(runs[1]).eval_returns.tolist() == [1.0, 1.0, 1.0]


def test_runs_of_two_model_sizes_are_two_curves_and_seeds_of_one_size_one(tmp_path):
    small = [load_run(fake_run(tmp_path / f"s{seed}", seed, [0, 0, 0], model="size1m")) for seed in (0, 1)]
    large = load_run(fake_run(tmp_path / "l0", 0, [0, 0, 0], model="size12m"))
    plain = load_run(fake_run(tmp_path / "p0", 0, [0, 0, 0]))
    assert small[0].label == small[1].label == "smoke Pendulum-v1 size1m"
    assert large.label == "smoke Pendulum-v1 size12m"
    assert plain.label == "smoke Pendulum-v1"  # no size preset: the label runs had before


def test_a_directory_without_runs_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no metrics.jsonl here or one level below"):
        find_runs([tmp_path])


def test_plot_runs_script_writes_a_png(tmp_path):
    a = fake_run(tmp_path / "a", 0, [-900, -700, -500])
    b = fake_run(tmp_path / "b", 1, [-800, -600, -300])
    out = tmp_path / "curves.png"
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "plot_runs.py"), str(a), str(b), "--out", str(out)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{out}: 2 runs"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_labels_make_one_curve_per_argument_whatever_the_configs(tmp_path):
    """An A/B of one experiment: without --label both settings' runs would be seeds of one curve."""
    for side in ("joint", "separate"):
        for seed in (0, 1):
            fake_run(tmp_path / side / f"seed_{seed}", seed, [-900, -700, -500])
    script = [sys.executable, str(REPO_ROOT / "scripts" / "plot_runs.py"), str(tmp_path / "joint"),
              str(tmp_path / "separate")]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    out = tmp_path / "ab.png"
    result = subprocess.run([*script, "--label", "joint", "--label", "separate", "--out", str(out)],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{out}: 4 runs" and out.exists()
    result = subprocess.run([*script, "--label", "joint", "--out", str(out)], capture_output=True, text=True,
                            timeout=120, env=env)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: 1 --label for 2 RUN_DIR: give one per RUN_DIR, or none"



def test_a_run_logged_before_eval_policy_existed_still_draws_its_curve(tmp_path):
    """Runs from before eval.policy logged eval_return_mean (the mode's): an A/B against one
    of them must not come out as a blank curve."""
    old = load_run(fake_run(tmp_path / "old", 0, [-900, -500, -300], return_key="eval_return_mean"))
    new = load_run(fake_run(tmp_path / "new", 0, [-800, -400, -200]))
    assert old.eval_returns.tolist() == [-900, -500, -300] and old.eval_frames.tolist() == [100, 200, 300]
    assert new.eval_returns.tolist() == [-800, -400, -200]

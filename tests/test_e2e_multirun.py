"""Hydra multirun, as a user at the terminal: `python -m dreamer -m seed=0,1 ...`, then a plot."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from test_e2e import ROOT

TINY = ["experiment=smoke", "compile=off", "train.total_frames=250", "eval.video=false",
        "logger.progress_bar=false", "checkpoint.every=1000"]


def test_multirun_over_seeds_then_plot_the_runs(tmp_path):
    sweep = tmp_path / "sweep"
    env = {**os.environ, "SDL_VIDEODRIVER": "dummy", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "dreamer", "-m", "seed=0,1", *TINY, f"hydra.sweep.dir={sweep}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for job, seed in (("0", 0), ("1", 1)):
        assert json.loads((sweep / job / "config.json").read_text())["seed"] == seed
        assert json.loads((sweep / job / "summary.json").read_text())["frames"] >= 250
    out = tmp_path / "seeds.png"
    plot = subprocess.run([sys.executable, str(ROOT / "scripts" / "plot_runs.py"), str(sweep), "--out", str(out)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert plot.returncode == 0, plot.stderr
    assert plot.stdout.strip() == f"{out}: 2 runs" and out.stat().st_size > 0

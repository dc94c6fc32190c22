"""Non-finite losses end to end: skipped, counted, and K in a row stop the run at a clean checkpoint."""

from __future__ import annotations

import pytest
import torch

from dreamer.run import checkpoint as ckpt
from tests.support.processes import FAST_STATES, read_metrics, start


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_consecutive_non_finite_updates_stop_the_run_pointing_to_a_clean_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    # Rewards x 1e38 overflow float32 to -inf: every world-model loss is infinite.
    proc = start(*FAST_STATES, f"hydra.run.dir={run_dir}", "algo.reward_scale=1e38",
                 "train.stop_after_nonfinite=5", "train.total_frames=100000")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err[-3000:]
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert last.startswith("error: 10 consecutive updates had non-finite losses or gradients")
    assert "Traceback" not in err
    newest = ckpt.load_latest(run_dir)
    assert f"saved in {newest['path']}" in last
    weights = newest["learner"]["modules"]
    assert all(torch.isfinite(w).all() for w in weights.values() if w.is_floating_point())
    logged = [m for m in read_metrics(run_dir) if "updates_skipped_nonfinite" in m]
    assert logged[-1]["updates_skipped_nonfinite"] == 10 and logged[-1]["nonfinite_streak"] == 10

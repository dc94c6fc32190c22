"""scripts/learning_check.py and train.max_minutes: a preset trained for a
wall-clock budget finishes by time with a final evaluation, and the check
passes or fails on the eval return inside that budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "learning_check.py"
BUDGET_MIN = 0.75


def check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL)


def test_a_run_stops_at_its_time_budget_and_the_check_judges_its_evals(tmp_path):
    out = tmp_path / "check"
    result = check(
        "--experiment", "smoke", "--seeds", "0", "--minutes", str(BUDGET_MIN), "--threshold=-1e9",
        "--episodes", "1", "--out", str(out),
        "--", "compile=off", "eval.video=false", "collector.num_workers=0", "eval.every=5",
        "train.total_frames=100000000",  # only the clock can end this run
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    run_dir = out / "seed_0"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["finished_by"] == "max_minutes"
    assert summary["frames"] < 100_000_000 and summary["eval_episodes"] == 1  # final eval ran
    assert summary["wall_s"] >= 60 * BUDGET_MIN  # the budget was spent; finished_by says the clock ended it
    evals = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in evals if "eval_return_mean" in r]
    assert evals and all("wall_s" in r for r in evals)
    report = json.loads((out / "learning_check.json").read_text())
    seed = report["seeds"][0]
    assert report["passed"] == 1 and seed["best_at_minutes"] <= BUDGET_MIN
    # Any return clears -1e9, so the first evaluation inside the budget is where it was reached.
    first_eval_minutes = min(r["wall_s"] for r in evals) / 60.0
    assert seed["reached_at_minutes"] == first_eval_minutes <= seed["best_at_minutes"]
    assert (out / "learning_curve.png").stat().st_size > 0

    # The same run against a return Pendulum cannot reach (its rewards are <= 0).
    again = check("--check", str(run_dir), "--minutes", str(BUDGET_MIN), "--threshold", "0",
                  "--out", str(tmp_path / "again"))
    assert again.returncode == 1, again.stdout + again.stderr
    assert "0/1 passed" in again.stdout and "NO" in again.stdout

"""benchmarks/update_paths.py: it runs (--help), and its summary is the median over
rounds of each round's median, with every path's speed against the losses path's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "update_paths.py"


def load():
    return load_script(SCRIPT)


def test_help_names_every_path():
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=True).stdout
    for path in ("eager", "losses", "whole", "captured", "captured_eager"):
        assert path in out


def test_the_summary_is_the_median_round_and_the_speed_against_the_compiled_losses_path():
    bench = load()
    rounds = {
        "losses": [{"wall_s": s, "compile_s": 30.0} for s in (0.10, 0.12, 0.30)],
        "whole": [{"wall_s": s, "compile_s": 40.0} for s in (0.05, 0.06, 0.50)],
    }
    summary = bench.summarize(rounds)
    assert summary["losses_s"] == 0.12 and summary["whole_s"] == 0.06
    assert summary["whole_vs_losses"] == pytest.approx(2.0)
    assert "losses_vs_losses" not in summary
    assert summary["whole_round_s"] == [0.05, 0.06, 0.50] and summary["losses_compile_s"] == [30.0] * 3


def test_each_path_is_the_config_it_names():
    bench = load()
    assert bench.path_overrides("eager") == ["compile.enabled=false", "compile.update=losses"]
    assert "compile.update=whole" in bench.path_overrides("whole")
    assert "compile.background=false" in bench.path_overrides("captured")
    captured_eager = bench.compose(bench.path_overrides("captured_eager") + ["device=cuda"])
    assert not captured_eager.compile.enabled and captured_eager.compile.update == "captured"

"""Every script in scripts/ and benchmark in benchmarks/ answers --help (DESIGN: each is runnable with
--help), and the benchmarks' shared harness reports the machine it measured on.

Each --help runs in-process (runpy, as `python FILE --help` runs it); one runs as its own process, so a
script that only works imported would still be caught. benchmarks/peers.py also runs ours at a tiny
setting, and says how to install a missing sheeprl (no test needs sheeprl)."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys

import pytest
import torch

from tests.support.paths import BENCHMARKS, SCRIPTS
from tests.support.scripts import load_script

RUNNABLE = sorted(SCRIPTS.glob("*.py")) + sorted(p for p in BENCHMARKS.glob("*.py") if p.name != "harness.py")


@pytest.mark.parametrize("script", RUNNABLE, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_script_help_describes_it_and_exits_0(script, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    monkeypatch.syspath_prepend(str(script.parent))  # as `python SCRIPT` puts its directory first
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr()
    assert exit_info.value.code in (0, None), out.err[-2000:]
    assert out.out.lower().startswith("usage:") and len(out.out.splitlines()) > 3


def test_a_benchmark_answers_help_as_its_own_process():
    script = BENCHMARKS / "update.py"  # imports the shared harness by name, as `python FILE` finds it
    result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True,
                            timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.lower().startswith("usage:") and len(result.stdout.splitlines()) > 3


def test_a_report_names_the_machine_it_was_measured_on(tmp_path):
    harness = load_script(BENCHMARKS / "harness.py")
    harness.write_report(tmp_path / "r.json", {"eager_s": 0.5})
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["eager_s"] == 0.5
    assert report["machine"]["cpu"] == harness.cpu_model() and report["machine"]["torch"] == torch.__version__


# -- benchmarks/peers.py: ours against sheeprl; no test needs sheeprl ----------------------------------------
PEERS = BENCHMARKS / "peers.py"


def _peers(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PEERS), *args], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, env=env)


def test_benchmark_peers_without_sheeprl_says_how_to_install_it_and_exits_2(tmp_path):
    # A sheeprl that fails to import stands in for a missing one, whether or not this venv has it.
    shadow = tmp_path / "shadow" / "sheeprl"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'sheeprl'\", name='sheeprl')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(shadow.parent),
                                                                      os.environ.get("PYTHONPATH")]))}
    result = _peers("--configs", "pendulum", env=env)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert "sheeprl==0.8.4" in lines[0] and "pip install -c" in lines[0] and "[peers]" in lines[0]


# -- benchmarks/update.py --flops: an update's FLOPs against this CPU's matmul rate ---------------------------
TINY_V3 = ("experiment=small", "compile.backend=eager", "buffer.batch_size=2", "buffer.batch_length=8",
           "algo.hidden_dim=16", "algo.rssm_hidden_dim=16", "algo.imagination_horizon=3")


def _flop_row(tmp_path, batch_size: int) -> dict:
    out = tmp_path / f"flops_{batch_size}.json"
    threads = torch.get_num_threads()  # the script sets this process's; the tests after it keep theirs
    try:
        code = load_script(BENCHMARKS / "update.py").main([
            *TINY_V3, f"buffer.batch_size={batch_size}", "--threads", "1", "--flops", "--warmup", "0", "--reps", "1",
            "--fill-steps", "64", "--json", str(out)])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    return json.loads(out.read_text())["threads"]["1"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_benchmark_update_flops_give_the_floor_under_an_update(tmp_path, capsys):
    """An update's FLOPs grow with the batch it learns from (every counted product is per sequence), and the
    floor is those FLOPs at the CPU's measured matmul rate: the fewest seconds an update can take there."""
    two, four = _flop_row(tmp_path, 2), _flop_row(tmp_path, 4)
    assert four["update_flops"] == pytest.approx(2 * two["update_flops"], rel=0.02)
    for row in (two, four):
        assert row["matmul_flops_per_s"] > 1e8  # any CPU this runs on does 0.1 GFLOP/s
        assert row["update_floor_s"] == pytest.approx(row["update_flops"] / row["matmul_flops_per_s"])
        assert row["matmul_rate_fraction"] == pytest.approx(row["update_floor_s"] / row["eager_s"])
    assert "GFLOP per update" in capsys.readouterr().out

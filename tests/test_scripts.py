"""Every script in scripts/ answers --help (DESIGN: each is runnable with --help).

Each script's --help runs in-process (runpy, as `python SCRIPT --help` runs it); one
runs as its own process, so a script that only works imported would still be caught.
scripts/benchmark_peers.py also runs ours at a tiny setting, and says how to install a
missing sheeprl (no test needs sheeprl)."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers_unit import load_script

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "scripts").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_help_describes_it_and_exits_0(script, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    monkeypatch.syspath_prepend(str(script.parent))  # as `python SCRIPT` puts its directory first
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr()
    assert exit_info.value.code in (0, None), out.err[-2000:]
    assert out.out.lower().startswith("usage:") and len(out.out.splitlines()) > 3


def test_a_script_answers_help_as_its_own_process():
    script = SCRIPTS[0]
    result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True,
                            timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.lower().startswith("usage:") and len(result.stdout.splitlines()) > 3


# -- scripts/benchmark_peers.py: ours against sheeprl; no test needs sheeprl ---------------------------------
PEERS = Path(__file__).resolve().parents[1] / "scripts" / "benchmark_peers.py"


def _peers(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PEERS), *args], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, env=env)


def test_benchmark_peers_times_ours_alone_and_writes_the_speedup_keys(tmp_path):
    out = tmp_path / "peers.json"
    result = _peers("--configs", "pendulum", "--sides", "ours_eager", "--rounds", "1", "--reps", "1",
                    "--warmup", "0", "--fill-steps", "200",
                    "--overrides", "buffer.batch_length=4", "algo.imagination_horizon=2", "--json", str(out))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    # The mapping is read from our composed config: our overrides reach sheeprl's settings.
    assert "algo.per_rank_sequence_length=4" in result.stdout and "algo.horizon=2" in result.stdout
    report = json.loads(out.read_text())
    for config in ("pendulum", "size1m"):
        for variant in ("", "_eager", "_compiled"):
            assert f"speedup_vs_sheeprl_{config}{variant}" in report
    assert report["speedup_vs_sheeprl_pendulum"] is None  # sheeprl did not run
    pendulum = report["configs"]["pendulum"]
    assert pendulum["shipped"] == "compiled"  # experiment=pendulum ships with compile on
    # As shipped is its compiled side, which this run left out: no figure, no speedup.
    assert pendulum["ours_eager_s"] > 0 and pendulum["ours_shipped_s"] is None
    assert pendulum["sheeprl_s"] is None and pendulum["ours_compiled_s"] is None
    params = pendulum["params"]["ours_eager"]
    assert set(params) >= {"encoder", "decoder", "reward", "continue", "actor", "critic"}
    assert all(count > 0 for count in params.values())


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


# -- scripts/benchmark_update.py --rssm-step-ab: the compiled RSSM step against the eager one --------------
UPDATE = Path(__file__).resolve().parents[1] / "scripts" / "benchmark_update.py"
TINY_V3 = ("experiment=small", "compile.backend=eager", "buffer.batch_size=2", "buffer.batch_length=8",
           "algo.hidden_dim=16", "algo.rssm_hidden_dim=16", "algo.imagination_horizon=3")


def _update_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(UPDATE), *args], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)


def test_benchmark_update_times_the_rssm_step_eager_and_compiled_side_by_side(tmp_path):
    out = tmp_path / "ab.json"
    result = _update_script(*TINY_V3, "--threads", "1", "--rssm-step-ab", "2", "--warmup", "1", "--reps", "2",
                            "--json", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    row = json.loads(out.read_text())["threads"]["1"]
    assert len(row["eager_rounds"]) == len(row["compiled_rounds"]) == 2
    assert row["rssm_step_eager_s"] > 0 and row["rssm_step_compiled_s"] > 0
    assert row["rssm_step_speedup"] == pytest.approx(row["rssm_step_eager_s"] / row["rssm_step_compiled_s"])
    assert "compiled step vs eager step" in result.stdout


def test_benchmark_update_rssm_step_ab_refuses_a_v1_preset_in_one_line():
    result = _update_script("experiment=small_v1", "--rssm-step-ab", "1")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == (
        "--rssm-step-ab needs a Dreamer V3 preset with compile.rssm_step=true")


def test_benchmark_update_times_the_imagination_with_and_without_its_graph(tmp_path):
    out = tmp_path / "imagination.json"
    # compile=off: the A/B runs the preset's compile setting, and eager is the cheap one to test.
    result = _update_script(*TINY_V3, "compile=off", "algo.actor_grad=reinforce", "--threads", "1",
                            "--imagination-graph-ab", "2", "--warmup", "1", "--reps", "2", "--json", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    row = json.loads(out.read_text())["threads"]["1"]
    assert len(row["recorded_rounds"]) == len(row["skipped_rounds"]) == 2
    assert row["imagination_graph_recorded_s"] > 0 and row["imagination_graph_skipped_s"] > 0
    assert row["imagination_graph_speedup"] == pytest.approx(
        row["imagination_graph_recorded_s"] / row["imagination_graph_skipped_s"])
    assert "not recorded vs recorded" in result.stdout


def test_benchmark_update_imagination_graph_ab_needs_a_reinforce_actor_loss():
    """Pendulum's actions are continuous: actor_grad=auto takes dynamics gradients."""
    result = _update_script(*TINY_V3, "--imagination-graph-ab", "1")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].startswith(
        "--imagination-graph-ab needs a REINFORCE actor loss: add algo.actor_grad=reinforce")


def _flop_row(tmp_path, batch_size: int) -> dict:
    out = tmp_path / f"flops_{batch_size}.json"
    threads = torch.get_num_threads()  # the script sets this process's; the tests after it keep theirs
    try:
        code = load_script("benchmark_update").main([
            *TINY_V3, f"buffer.batch_size={batch_size}", "--threads", "1", "--flops", "--warmup", "0", "--reps", "1",
            "--fill-steps", "64", "--json", str(out)])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    return json.loads(out.read_text())["threads"]["1"]


def test_benchmark_update_flops_give_the_floor_under_an_update(tmp_path, capsys):
    """An update's FLOPs grow with the batch it learns from (every counted product is per sequence), and the
    floor is those FLOPs at the CPU's measured matmul rate: what issue 16's first-update argument rests on."""
    two, four = _flop_row(tmp_path, 2), _flop_row(tmp_path, 4)
    assert four["update_flops"] == pytest.approx(2 * two["update_flops"], rel=0.02)
    for row in (two, four):
        assert row["matmul_flops_per_s"] > 1e8  # any CPU this runs on does 0.1 GFLOP/s
        assert row["update_floor_s"] == pytest.approx(row["update_flops"] / row["matmul_flops_per_s"])
        assert row["matmul_rate_fraction"] == pytest.approx(row["update_floor_s"] / row["eager_s"])
    assert "GFLOP per update" in capsys.readouterr().out


# -- scripts/benchmark_eval.py: the evaluation batched against one episode at a time (in-process) -----------
def test_benchmark_eval_times_the_batched_evaluation_against_one_episode_at_a_time(tmp_path, capsys):
    out = tmp_path / "eval.json"
    threads = torch.get_num_threads()  # the script sets this process's; the tests after it keep theirs
    try:
        code = load_script("benchmark_eval").main([
            "experiment=small", "env=pendulum", "eval.episodes=3", "env.max_episode_steps=8", "buffer.batch_length=4",
            "algo.hidden_dim=16", "algo.rssm_hidden_dim=16", "--rounds", "2", "--threads", "1", "--json", str(out)])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    row = json.loads(out.read_text())
    assert row["episodes"] == 3 and row["frames_per_eval"] == 3 * 8 * 2  # Pendulum's action repeat: 2
    assert len(row["batched_rounds"]) == len(row["one_by_one_rounds"]) == 2
    assert row["speedup"] == pytest.approx(row["one_by_one_s"] / row["batched_s"])
    printed = capsys.readouterr().out
    assert "one by one" in printed and "batched" in printed


def test_benchmark_eval_answers_bad_overrides_in_one_line(capsys):
    threads = torch.get_num_threads()
    try:
        assert load_script("benchmark_eval").main(["experiment=small", "eval.episodes=0"]) == 2
    finally:
        torch.set_num_threads(threads)
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "eval.episodes" in err

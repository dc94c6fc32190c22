"""The side-by-side benchmarks keep working where no GPU, sheeprl or JAX is: benchmarks/peers.py's TorchRL side
(the recipe's own stepper) times and reports at a tiny setting with ours' parameter count, benchmarks/gpu_bench.py's
--cpu mode runs every side a CPU can run and says why each other one did not, and our update paths that need a
config key not in the schema yet are skipped with a line instead of failing."""

from __future__ import annotations

import json

import pytest

from tests.support.paths import BENCHMARKS
from tests.support.scripts import load_script

TINY_PEERS = ("--configs", "pendulum", "--rounds", "1", "--reps", "1", "--warmup", "0", "--fill-steps", "200",
              "--overrides", "buffer.batch_length=4", "algo.imagination_horizon=2", "algo.hidden_dim=16",
              "algo.rssm_hidden_dim=16")


def _run(script: str, *args: str, capsys) -> tuple[int, str, str]:
    """The benchmark's main(ARGS) in this process (it has torch imported already; the sides
    it starts are processes of their own): (exit status, stdout, stderr)."""
    status = load_script(BENCHMARKS / script).main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_peers_times_torchrls_stepper_beside_ours_with_the_same_parameters(tmp_path, capsys):
    out = tmp_path / "peers.json"
    status, stdout, stderr = _run("peers.py", *TINY_PEERS, "--sides", "ours_eager", "torchrl_eager", "--json", str(out),
                                  capsys=capsys)
    assert status == 0, stdout[-3000:] + stderr[-3000:]
    report = json.loads(out.read_text())
    for config in ("pendulum", "size1m"):
        for variant in ("", "_eager", "_compiled", "_whole"):
            assert f"speedup_vs_torchrl_{config}{variant}" in report
    # Eager against eager ran side by side; as shipped (compiled) and the compiled stepper did not.
    assert report["speedup_vs_torchrl_pendulum_eager"] > 0
    assert report["speedup_vs_torchrl_pendulum"] is None and report["speedup_vs_torchrl_pendulum_compiled"] is None
    pendulum = report["configs"]["pendulum"]
    assert pendulum["torchrl_eager_s"] > 0 and pendulum["ours_eager_s"] > 0
    # The recipe's config is read off ours: the same weights, module by module.
    params = pendulum["params"]
    assert set(params["ours_eager"]) >= {"encoder", "decoder", "reward", "continue", "actor", "critic"}
    assert params["torchrl_eager"] == params["ours_eager"] and all(n > 0 for n in params["ours_eager"].values())
    assert pendulum["torchrl_recipe"]["torchrl_eager"]["replay_buffer"] == {"batch_size": 16, "seq_len": 4}
    # As shipped is the compiled side (experiment=small ships with compile on), which this run left out.
    assert pendulum["shipped"] == "compiled" and pendulum["ours_shipped_s"] is None
    assert pendulum["ours_compiled_s"] is None
    # sheeprl's side was not asked for: its keys are there, without figures; the mapping is read
    # from our composed config, so our overrides reach sheeprl's settings.
    for config in ("pendulum", "size1m"):
        for variant in ("", "_eager", "_compiled"):
            assert f"speedup_vs_sheeprl_{config}{variant}" in report
    assert report["speedup_vs_sheeprl_pendulum"] is None and pendulum["sheeprl_s"] is None
    assert "algo.per_rank_sequence_length=4" in stdout and "algo.horizon=2" in stdout


def test_an_update_path_the_schema_lacks_is_skipped_with_a_reason(monkeypatch):
    harness = load_script(BENCHMARKS / "harness.py")
    assert harness.schema_has("compile.enabled") and harness.schema_has("algo")
    assert not harness.schema_has("compile.no_such_key") and not harness.schema_has("seed.no_such_key")

    monkeypatch.setattr(harness, "schema_has", lambda key: False)
    assert harness.update_path_overrides("losses") == ([], None)  # a checkout without the key: compiled losses
    overrides, why = harness.update_path_overrides("captured")
    assert overrides == [] and harness.UPDATE_PATH_KEY in why and "captured" in why

    monkeypatch.setattr(harness, "schema_has", lambda key: key == harness.UPDATE_PATH_KEY)
    assert harness.update_path_overrides("captured") == ([f"{harness.UPDATE_PATH_KEY}=captured"], None)


class FakeSide:
    """A gpu_bench side that builds and times at once: ``params`` and ``math`` as it reports them."""

    started: list = []

    def __init__(self, name, python, script, spec, **kwargs):
        self.name, self.stopped, self.timed = name, False, 0
        self.info = {"params": spec["params"], "math": spec["math"], "compile_warmup_s": None, "build_s": 0.1}
        FakeSide.started.append(self)

    def built(self, timeout_s=None):
        return self.info

    def time(self, warmup, reps, back_to_back=False):
        assert back_to_back and not self.stopped
        self.timed += 1
        return {"wall_s": 0.2, "cpu_s": 0.2, "walls": [0.2] * reps, "back_to_back_s": 0.1}

    def stop(self):
        self.stopped = True


def test_gpu_bench_refuses_a_side_of_another_size_or_math_and_rotates_the_order_of_the_rest(monkeypatch, capsys):
    """No process started: sides that report their parameters and math settings as given."""
    bench = load_script(BENCHMARKS / "gpu_bench.py")
    math = {"float32_matmul_precision": "high", "cudnn.allow_tf32": True, "cudnn.benchmark": True}
    params = {row: 1000 for row in load_script(BENCHMARKS / "harness.py").PARAM_ROWS}  # 8,000 in all
    reported = {
        "ours_losses": (params, math),
        "torchrl": ({**params, "actor": 1156}, math),  # 1.95% more: the same model
        "sheeprl": ({**params, "actor": 1164}, None),  # 2.05% more: refused
        "jax": (params, {**math, "cudnn.benchmark": False}),  # other math: refused
        "other": (params, None),
    }
    recipe = {"networks": {}, "optimization": {}, "replay_buffer": {}}  # what run_size prints of TorchRL's
    plans = {side: ("python", {"kind": side, "params": p, "math": m, "recipe": recipe}, {})
             for side, (p, m) in reported.items()}
    monkeypatch.setattr(bench, "plan", lambda *a: (plans, {}))
    monkeypatch.setattr(bench, "SideProcess", FakeSide)
    FakeSide.started = []
    skips = []
    args = bench.parse_args(["--cpu", "--rounds", "4", "--reps", "2", "--no-first-update"])
    result = bench.run_size("tiny_states", bench.CPU_SIZES["tiny_states"], args, bench.Budget(600, 0),
                            lambda where, why: skips.append(f"{where}: {why}"))
    refused = [line for line in skips if "not timed" in line]
    assert len(refused) == 2 and refused[0].startswith("sheeprl: 8,164 parameters against ours_losses's 8,000 (+2.")
    assert refused[1].startswith("jax: math settings")
    by_name = {side.name: side for side in FakeSide.started}
    assert by_name["sheeprl"].stopped and by_name["sheeprl"].timed == 0 and by_name["jax"].timed == 0
    timed = ["ours_losses", "torchrl", "other"]
    assert result["orders"] == [timed, timed[1:] + timed[:1], timed[2:] + timed[:2], timed]
    assert set(result["sides"]) == set(timed)
    ours = result["sides"]["ours_losses"]
    assert ours["s_per_update"] == 0.2 and ours["back_to_back_s"] == 0.1 and ours["updates_per_s"] == 10.0
    assert result["speedup_vs_torchrl_losses"] == 1.0 and result["throughput_vs_torchrl"] == 1.0
    assert "math torchrl: {'float32_matmul_precision': 'high'" in capsys.readouterr().out


def test_gpu_bench_gives_torchrls_stepper_our_cuda_math_before_it_builds(monkeypatch):
    """On the CPU the settings are no-ops (dreamer.system.device.configure_cuda_math), so the side's
    call is what is checked here; the slow --cpu test checks both sides report the same settings."""
    import dreamer.system.device as device

    bench = load_script(BENCHMARKS / "gpu_bench.py")
    args = bench.parse_args(["--cpu", "--sides", "ours_losses", "torchrl"])
    for fast in (True, False):
        overrides = [*bench.CPU_SIZES["tiny_states"], f"cuda_fast_math={str(fast).lower()}"]
        plans, skips = bench.plan("tiny_states", overrides, args, "/nonexistent")
        assert set(plans) == {"ours_losses", "torchrl"} and skips["jax"] == skips["sheeprl"] == "left out by --sides"
        spec = plans["torchrl"][1]
        calls = []
        monkeypatch.setattr(device, "configure_cuda_math", lambda *call: calls.append(call))
        monkeypatch.setattr(bench.torchrl_v3, "recipe_train", lambda: pytest.fail("built before the math was set"))
        with pytest.raises(pytest.fail.Exception):
            bench.torchrl_v3.build_torchrl(spec)
        assert [(str(d), f) for d, f in calls] == [("cpu", fast)]


@pytest.mark.parametrize("mode", [[], ["--cpu"]])
def test_gpu_bench_runs_the_reference_size_alone_by_default_and_refuses_it_beside_another(mode, capsys):
    bench = load_script(BENCHMARKS / "gpu_bench.py")
    alone, other = ("tiny_states", "tiny_pixels") if mode else ("size1m", "size12m")
    assert bench.parse_args(mode).sizes == [alone]
    assert bench.parse_args([*mode, "--sizes", other]).sizes == [other]
    with pytest.raises(SystemExit) as stop:
        bench.parse_args([*mode, "--sizes", alone, other])
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{alone} runs alone" in error and "a call of its own" in error


def test_gpu_bench_without_cuda_says_to_use_cpu_and_exits_2(capsys):
    status, stdout, stderr = _run("gpu_bench.py", capsys=capsys)
    assert status == 2, stdout[-2000:] + stderr[-2000:]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "--cpu" in lines[0]


def test_gpu_bench_skips_what_its_budget_cannot_fit_and_says_so(tmp_path, capsys):
    out = tmp_path / "bench.json"
    status, stdout, stderr = _run("gpu_bench.py", "--cpu", "--budget-s", "0", "--json", str(out), capsys=capsys)
    assert status == 0, stdout[-2000:] + stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["sizes"] == {} and report["first_update_s_tiny_states"] is None
    assert any(s.startswith("tiny_states: ") and "--budget-s" in s for s in report["skips"])
    assert any(s.startswith("tiny_states first update: ") for s in report["skips"])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_gpu_bench_cpu_mode_runs_every_cpu_side_and_gives_every_skip_a_reason(tmp_path, capsys):
    """The default size, alone (where the JAX and sheeprl sides would run): the pixel size only changes the
    preset's env."""
    out = tmp_path / "bench.json"
    status, stdout, stderr = _run("gpu_bench.py", "--cpu", "--rounds", "2", "--reps", "1",
                                  "--warmup", "0", "--budget-s", "840", "--json", str(out), capsys=capsys)
    assert status == 0, stdout[-3000:] + stderr[-3000:]
    report = json.loads(out.read_text())
    assert list(report["sizes"]) == ["tiny_states"]
    for size in ("tiny_states",):
        # Ours (the losses path) and TorchRL's stepper ran side by side, with the same weights and the same
        # math settings, per synced update and back to back, each opening a round.
        assert report[f"speedup_vs_torchrl_{size}"] > 0 and report[f"speedup_vs_torchrl_{size}_losses"] > 0
        assert report[f"throughput_vs_torchrl_{size}"] > 0
        sides = report["sizes"][size]["sides"]
        assert sides["ours_losses"]["params"] == sides["torchrl"]["params"]
        assert sides["ours_losses"]["math"] == sides["torchrl"]["math"] is not None
        assert all(side["back_to_back_s"] > 0 and side["updates_per_s"] > 0 for side in sides.values())
        assert report["sizes"][size]["orders"] == [["ours_losses", "torchrl"], ["torchrl", "ours_losses"]]
        # Captured needs CUDA: no figure, a reason.
        assert report[f"speedup_captured_vs_losses_{size}"] is None and "ours_captured" not in sides
        assert report[f"first_update_s_{size}"] > 0
    for key in ("speedup_vs_jax_tiny_states", "speedup_vs_sheeprl_tiny_states"):
        assert key in report
    assert any("ours_captured" in s and "CUDA" in s for s in report["skips"])
    for line in report["skips"]:
        where, _, why = line.partition(": ")
        assert where and why.strip(), line


@pytest.mark.mujoco
def test_render_benchmark_reports_each_size_against_a_control_step(tmp_path, capsys):
    out = tmp_path / "render.json"
    report = load_script(BENCHMARKS / "render.py").main(
        ["--task", "cartpole-balance", "--sizes", "16", "24x32", "--calls", "2", "--reps", "2", "--json", str(out)])
    assert json.loads(out.read_text())["machine"]
    assert set(report["median_us"]) == {"step", "16x16", "24x32"} and all(v > 0 for v in report["median_us"].values())
    median = report["median_us"]
    assert report["render_over_step"]["24x32"] == pytest.approx(median["24x32"] / median["step"])
    assert "render 24x32" in capsys.readouterr().out

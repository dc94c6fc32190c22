"""scripts/gpu_check.py: its CPU-provable subset passes here (CI runs it so), its report names every
check its markers name, a GPU test without a check is refused, and a failed, skipped or missing test is
never reported as a pass."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support import gpu_checks
from tests.support.paths import REPO_ROOT
from tests.support.scripts import load_script

SCRIPT = REPO_ROOT / "scripts" / "gpu_check.py"




# Two of the CPU-provable checks, run for real: the suite runs every check's tests itself, so
# this test proves the script's plumbing (collect, run, judge, report) without running them twice.
RUN_HERE = (gpu_checks.DEVICE_CLOCK, gpu_checks.REPLAY_SIZE_PER_NODE)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_cpu_subset_runs_and_the_report_lists_every_check(tmp_path, capsys):
    gpu_check = load_script(SCRIPT)
    report_path = tmp_path / "report.json"
    only = [name.split(";")[0] for name in RUN_HERE]  # --only takes any part of a check's name
    # In this process (its pytest runs are processes of their own).
    status = gpu_check.main(["--cpu-only", "--only", *only, "--json", str(report_path)])
    out, err = capsys.readouterr()
    assert status == 0, out[-4000:] + err[-2000:]
    lines = out.splitlines()
    assert lines[0].startswith("no CUDA here (") or "--cpu-only" in lines[0]
    report = json.loads(report_path.read_text())
    listed = report["checks"]  # what its pytest collection found, by marker
    cpu, gpu = listed["gpu_acceptance"], listed["cuda"] + listed["run"]
    assert listed["run"] == gpu_check.GPU_RUN_CHECKS
    names = {value for key, value in vars(gpu_checks).items() if key.isupper()}
    assert set(cpu) | set(gpu[:-len(gpu_check.GPU_RUN_CHECKS)]) == names  # every named check has its tests
    assert set(RUN_HERE) <= set(cpu)
    assert [r["check"] for r in report["results"]] == cpu + gpu
    for result in report["results"]:
        expected = "PASS" if result["check"] in RUN_HERE else "SKIP"
        assert result["status"] == expected, result
        assert any(line.startswith(f"{expected} {result['check']}") for line in lines)
        if result["check"] in cpu and expected == "SKIP":
            assert result["detail"] == "not selected (--only)", result
        if result["check"] in gpu:
            assert result["detail"] != "not selected (--only)", result  # no CUDA is the reason, not --only
    assert report["counts"] == {"PASS": len(RUN_HERE), "FAIL": 0, "SKIP": len(cpu) + len(gpu) - len(RUN_HERE)}
    assert lines[-1] == f"{len(RUN_HERE)} passed, 0 failed, {len(cpu) + len(gpu) - len(RUN_HERE)} skipped"


def test_only_runs_the_named_checks_in_report_order_and_a_text_naming_none_is_one_line(capsys):
    gpu_check = load_script(SCRIPT)
    checks = [("alpha check", ["t.py::a"]), ("Beta check", ["t.py::b"]), ("gamma", ["t.py::c"])]
    names = [name for name, _ in checks]
    ran = []

    def run(chosen):
        ran.append([name for name, _ in chosen])
        return [gpu_check.Result(name, "PASS") for name, _ in reversed(chosen)]

    results = gpu_check.Selection(["beta", "GAMMA"], names).run(checks, run)
    assert ran == [["Beta check", "gamma"]]  # one run, the selected checks only
    assert [(r.check, r.status) for r in results] == [("alpha check", "SKIP"), ("Beta check", "PASS"),
                                                      ("gamma", "PASS")]
    assert gpu_check.Selection(None, names).run(checks, run)[0].status == "PASS"  # no --only: every check
    with pytest.raises(SystemExit) as stopped:
        gpu_check.Selection(["delta"], names)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --only 'delta' names no check") and err.count("\n") == 1


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_gpu_test_that_names_no_check_is_a_usage_error(tmp_path):
    """A cuda test outside every check would never run where a GPU is: collection refuses it."""
    (tmp_path / "test_unnamed.py").write_text("import pytest\n\n@pytest.mark.cuda\ndef test_x():\n    pass\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-n", "0",
                          "--rootdir", str(REPO_ROOT), "-c", str(REPO_ROOT / "pyproject.toml"),
                          "-p", "tests.conftest", str(tmp_path / "test_unnamed.py")],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert out.returncode == 4, out.stdout[-2000:] + out.stderr[-2000:]
    assert "needs the name of its line in scripts/gpu_check.py's report" in out.stdout + out.stderr


def test_a_failed_skipped_or_missing_test_is_never_a_pass():
    gpu_check = load_script(SCRIPT)
    checks = [("ok", ["t.py::a"]), ("fails", ["t.py::b"]), ("skips", ["t.py::c"]), ("partly skipped", ["t.py::d"]),
              ("gone", ["t.py::e"]), ("whole file", ["u.py"])]
    outcomes = {"t.py::a": ("passed", ""), "t.py::b[x]": ("passed", ""), "t.py::b[y]": ("failed", "boom"),
                "t.py::c": ("skipped", "needs CUDA"), "t.py::d[cpu]": ("passed", ""),
                "t.py::d[cuda]": ("skipped", "needs CUDA"), "u.py::f": ("passed", "")}
    judged = {r.check: (r.status, r.detail) for r in gpu_check.judge(checks, outcomes, require_all_run=False)}
    assert judged == {
        "ok": ("PASS", "1 test(s)"), "fails": ("FAIL", "b[y]: boom"), "skips": ("SKIP", "skipped: needs CUDA"),
        "partly skipped": ("PASS", "1 test(s)"), "gone": ("FAIL", "did not run (renamed or removed?): t.py::e"),
        "whole file": ("PASS", "1 test(s)"),
    }
    strict = {r.check: r.status for r in gpu_check.judge(checks, outcomes, require_all_run=True)}
    assert strict["skips"] == strict["partly skipped"] == "FAIL"  # on a GPU, CUDA tests must run


def test_a_worker_is_judged_by_its_gpu_memory_not_by_a_driver_mapping():
    """On the first GPU run (2026-11-26, H200) every collector worker mapped /dev/nvidia0:
    torchrl's collector calls torch.cuda.is_available() in each worker, which initialises
    the driver. nvidia-smi's per-process GPU memory tells a context from that; without
    it the mappings alone cannot, and the check says so (SKIP) instead of failing."""
    gpu_check = load_script(SCRIPT)
    learner, workers = 100, [101, 102]
    maps = {100: {"/dev/nvidia0": 2**30, "/dev/nvidia-uvm": 2**21}, 101: {"/dev/nvidia0": 2**16},
            102: {"/dev/nvidia0": 2**16}}
    status, evidence = gpu_check.judge_contexts(learner, workers, maps, {100: 812})
    assert status == "PASS" and "0 holding a context" in evidence, evidence
    status, evidence = gpu_check.judge_contexts(learner, workers, maps, {100: 812, 102: 310})
    assert status == "FAIL" and "1 holding a context" in evidence and "102: 310" in evidence
    status, _ = gpu_check.judge_contexts(learner, workers, maps, {100: 812, 101: -1})  # MIG: memory [N/A]
    assert status == "FAIL"
    for unlisted in (None, {7: 812}):  # nvidia-smi absent, or a container host's pids
        status, evidence = gpu_check.judge_contexts(learner, workers, maps, unlisted)
        assert status == "SKIP" and "/dev/nvidia0" in evidence
    assert gpu_check.judge_contexts(learner, [], maps, {100: 812})[0] == "FAIL"  # no workers found


def test_without_imageio_ffmpeg_the_runs_still_start(monkeypatch, capsys):
    """The second GPU run (2026-11-26) carried no imageio-ffmpeg: every smoke run died at its
    first open-loop video. A run that would write videos without it now stops at its start,
    so the script's runs write none there, and with it they keep the open-loop video."""
    import hydra
    from hydra.core.global_hydra import GlobalHydra

    from dreamer.config import load_config, register_configs
    from dreamer.errors import UserError
    from dreamer.report.logger import check_video_writer
    from dreamer.report.openloop import openloop_enabled
    from tests.support.paths import CONF_DIR

    def writes_videos(overrides) -> bool:
        register_configs()
        GlobalHydra.instance().clear()
        try:
            with hydra.initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                cfg = load_config(hydra.compose("config", overrides=["experiment=smoke", *overrides]))
        finally:
            GlobalHydra.instance().clear()
        return cfg.eval.video or openloop_enabled(cfg.eval, cfg.env)

    gpu_check = load_script(SCRIPT)
    assert gpu_check.run_overrides() == gpu_check.QUIET  # installed here: videos as usual
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # `import imageio_ffmpeg` now raises ImportError
    with pytest.raises(UserError, match="videos need imageio-ffmpeg"):
        check_video_writer(writes_videos(gpu_check.QUIET))  # what stopped every run
    overrides = gpu_check.run_overrides()
    assert "imageio-ffmpeg is not installed" in capsys.readouterr().out
    check_video_writer(writes_videos(overrides))  # the runs start

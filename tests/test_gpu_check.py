"""scripts/gpu_check.py: its CPU-provable subset passes here (CI runs it so), its report
names every check, and a failed, skipped or missing test is never reported as a pass."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers_unit import REPO_ROOT, load_script

SCRIPT = REPO_ROOT / "scripts" / "gpu_check.py"




def test_the_cpu_subset_passes_and_the_report_lists_every_check(tmp_path):
    gpu_check = load_script("gpu_check")
    report_path = tmp_path / "report.json"
    out = subprocess.run([sys.executable, str(SCRIPT), "--cpu-only", "--json", str(report_path)], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("no CUDA here (") or "--cpu-only" in lines[0]
    report = json.loads(report_path.read_text())
    cpu = [name for name, _ in gpu_check.CPU_CHECKS]
    gpu = [name for name, _ in gpu_check.CUDA_TESTS] + gpu_check.GPU_RUN_CHECKS
    assert [r["check"] for r in report["results"]] == cpu + gpu
    for result in report["results"]:
        expected = "PASS" if result["check"] in cpu else "SKIP"
        assert result["status"] == expected, result
        assert any(line.startswith(f"{expected} {result['check']}") for line in lines)
    assert report["counts"] == {"PASS": len(cpu), "FAIL": 0, "SKIP": len(gpu)}
    assert lines[-1] == f"{len(cpu)} passed, 0 failed, {len(gpu)} skipped"


def test_every_test_the_script_names_exists():
    """The CUDA-only tests only run on a GPU: a renamed one must not wait for a GPU to be noticed."""
    gpu_check = load_script("gpu_check")
    nodes = [node for _, ids in gpu_check.CPU_CHECKS + gpu_check.CUDA_TESTS for node in ids]
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *nodes],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]


def test_a_failed_skipped_or_missing_test_is_never_a_pass():
    gpu_check = load_script("gpu_check")
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

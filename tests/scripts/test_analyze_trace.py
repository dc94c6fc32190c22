"""scripts/analyze_trace.py: breakdown of a plain torch.profiler trace, before/after, streaming."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from tests.support.paths import REPO_ROOT, SCRIPTS
from tests.support.scripts import load_script

SCRIPT = REPO_ROOT / "scripts" / "analyze_trace.py"


def analyze(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def plain_trace(tmp_path_factory):
    """A torch.profiler trace of three named steps of a small matmul loop."""
    path = tmp_path_factory.mktemp("trace") / "plain.json"
    x = torch.randn(64, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            with record_function("## train/world_model ##"):
                (x @ x).relu().sum()
    prof.export_chrome_trace(str(path))
    return path


def test_breakdown_of_a_plain_profiler_trace(plain_trace):
    result = analyze(str(plain_trace))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    row = next(line for line in out.splitlines() if line.startswith("## train/world_model ##"))
    assert row.split()[-1] == "3"  # calls
    assert "Top 20 ops by self time" in out and "aten::mm" in out
    assert "Memcpy HtoD / DtoH: none" in out
    eager = next(line for line in out.splitlines() if line.startswith("eager aten ops"))
    assert int(eager.split()[-1]) > 0


def test_compare_prints_before_and_after(plain_trace, tmp_path):
    before = json.loads(plain_trace.read_text())
    for e in before["traceEvents"]:
        if e.get("name") == "## train/world_model ##":
            e["dur"] = e["dur"] * 2  # the "before" run was twice as slow
    before_path = tmp_path / "before.json"
    before_path.write_text(json.dumps(before))
    result = analyze(str(plain_trace), "--compare", str(before_path))
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.split("Before -> after")[1].splitlines()
               if line.startswith("## train/world_model ##"))
    assert row.split()[-1] == "-50.0%"


def test_streaming_across_chunk_boundaries_matches_a_full_load(plain_trace, monkeypatch):
    analyzer = load_script(SCRIPTS / "analyze_trace.py")
    whole = json.loads(plain_trace.read_text())["traceEvents"]
    monkeypatch.setattr(analyzer, "CHUNK", 97)  # every event straddles a read
    assert list(analyzer.iter_events(plain_trace)) == whole


def test_compiled_kernels_are_told_apart_from_eager_ops(tmp_path):
    events = [
        {"ph": "X", "cat": "kernel", "name": "triton_poi_fused_add_0", "pid": 0, "tid": 1, "ts": 1, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": "Torch-Compiled Region: 0/0", "pid": 1, "tid": 1, "ts": 0, "dur": 9},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 2},
        {"ph": "X", "cat": "cpu_op", "name": "## Call CompiledFxGraph fxabc ##", "pid": 1, "tid": 1, "ts": 1, "dur": 5},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "pid": 0, "tid": 2, "ts": 0,
         "dur": 1500},
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    summary = load_script(SCRIPTS / "analyze_trace.py").summarize(path)
    assert summary.kernels["triton kernels (compiled)"] == 1
    assert summary.kernels["compiled regions entered"] == 1
    assert summary.kernels["compiled graph calls"] == 1 and not summary.ranges  # not one of our ranges
    assert summary.kernels["eager aten ops"] == 1
    assert summary.memcpy["Memcpy HtoD"].total_us == 1500


def test_a_file_that_is_not_a_trace_is_one_error_line(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"hello": 1}')
    result = analyze(str(path))
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {path}: no traceEvents array; is this a Chrome trace?"

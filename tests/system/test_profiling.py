"""dreamer/system/profiling.py: PROF_* settings, the traced window, one merged trace."""

from __future__ import annotations

import json

import pytest

from dreamer.config import load_config, profiling_from_env
from dreamer.errors import UserError
from dreamer.system.profiling import merge_traces
from tests.support.paths import SCRIPTS
from tests.support.processes import dreamer_env, run_dreamer
from tests.support.scripts import load_script

REQUIRED_RANGES = {
    "## train/sample ##", "## train/transform ##", "## train/world_model ##", "## train/actor ##",
    "## train/value ##", "## train/optim ##", "## collect/step ##", "## collect/write ##",
}




def test_prof_environment_variables_fill_the_profiling_config():
    cfg = load_config({}, environ={"PROF_ENABLED": "1", "PROF_ITERATIONS": "50-55",
                                   "PROF_OUTPUT_DIR": "/tmp/tr", "PROF_MODE": "full"})
    p = cfg.profiling
    assert (p.enabled, p.first_update, p.last_update, p.output_dir, p.mode) == (True, 50, 55, "/tmp/tr", "full")


def test_profiling_is_off_without_the_environment():
    assert not load_config({}, environ={}).profiling.enabled
    assert profiling_from_env({"PATH": "/bin"}) == {}


@pytest.mark.parametrize(
    "environ, message",
    [
        ({"PROF_ITERATIONS": "fifty"}, "PROF_ITERATIONS='fifty' must be FIRST-LAST"),
        ({"PROF_ITERATIONS": "55-50"}, "profiling window 55-50 is empty"),
        ({"PROF_MODE": "verbose"}, "profiling.mode='verbose' is not allowed; choose one of: lite, full"),
        ({"PROF_ENABLED": "maybe"}, "PROF_ENABLED='maybe' must be 1 or 0"),
    ],
)
def test_bad_prof_settings_are_one_clear_message(environ, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        load_config({}, environ=environ)


def _trace(path, pid, base_ns, events):
    meta = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python"}},
            {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}}]
    path.write_text(json.dumps({"baseTimeNanoseconds": base_ns, "traceEvents": meta + events}))
    return path


def test_merge_gives_each_source_its_own_rows_on_one_clock(tmp_path):
    # Both processes ran a range at the same wall-clock instant; their files use
    # different time bases, and both have a GPU row with pid 0.
    a = _trace(tmp_path / "a.json", 7, 1_000_000_000, [
        {"ph": "X", "name": "## train/sample ##", "cat": "user_annotation", "pid": 7, "tid": 7, "ts": 500.0, "dur": 10},
        {"ph": "X", "name": "kernel", "cat": "kernel", "pid": 0, "tid": 1, "ts": 505.0, "dur": 1}])
    b = _trace(tmp_path / "b.json", 7, 1_000_200_000, [
        {"ph": "X", "name": "## collect/step ##", "cat": "user_annotation", "pid": 7, "tid": 7, "ts": 300.0, "dur": 10},
        {"ph": "X", "name": "kernel", "cat": "kernel", "pid": 0, "tid": 1, "ts": 305.0, "dur": 1}])
    merged = json.loads(merge_traces([("learner", a), ("collector worker 1", b)], tmp_path / "m.json").read_text())
    events = merged["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert sorted(names.values()) == ["collector worker 1", "collector worker 1 (GPU 0)", "learner", "learner (GPU 0)"]
    ranges = {e["name"]: e for e in events if e["name"].startswith("##")}
    assert ranges["## train/sample ##"]["ts"] == ranges["## collect/step ##"]["ts"]
    assert ranges["## train/sample ##"]["pid"] != ranges["## collect/step ##"]["pid"]


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_profiled_run_writes_one_merged_trace_with_every_named_range(tmp_path):
    traces = tmp_path / "traces"
    env = {**dreamer_env(), "PROF_ENABLED": "1",
           # 25 updates per collector batch here: the window spans a batch write.
           "PROF_ITERATIONS": "10-40", "PROF_OUTPUT_DIR": str(traces), "PROF_MODE": "lite"}
    result = run_dreamer("experiment=smoke", "env=pendulum", "compile=off", "train.total_frames=300",
                         "eval.video=false", f"hydra.run.dir={tmp_path / 'run'}", "logger.progress_bar=false", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = load_script(SCRIPTS / "analyze_trace.py").summarize(traces / "merged_trace.json")
    rows = set(summary.processes.values())
    assert "learner" in rows and any(row.startswith("collector worker ") for row in rows)
    assert REQUIRED_RANGES <= set(summary.ranges)
    # The learner traced exactly updates 10..40.
    assert summary.ranges["## train/world_model ##"].calls == 31
    assert summary.ranges["## train/optim ##"].calls == 2 * 31  # the world model step; the actor and value steps

"""`python -m dreamer` with inputs that ended in a traceback or ran on regardless (issue 45
item 11), or left a directory behind (issue 57): one `error:` line, exit status 2, and nothing
written (no run directory, or the resumed one untouched). Each refusal runs in-process in
tests/test_check.py; here, one of each kind as its own process, from a fresh working directory."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.config.test_up_front_checks import read_only
from tests.support.processes import FAST, FAST_STATES, ROOT, dreamer_env, run_dreamer


def _one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines[-5:]
    return lines[0]


def _tree(root: Path) -> dict:
    """Every file under ``root``: (size, mtime); not the run lock, which names whoever took it last."""
    return {p.relative_to(root): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")
            if p.is_file() and p.name != "run.lock"}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    result = run_dreamer(*FAST_STATES, "train.total_frames=200", "train.train_ratio=8", "eval.openloop=false",
                         f"hydra.run.dir={run_dir}")  # learning starts at its last batch: 5 updates
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def test_a_bad_value_stops_before_hydra_writes_anything(tmp_path):
    """The value checks' layer as its own process; every other bad value takes the same path
    in-process (tests/config/test_up_front_checks.py)."""
    run_dir = tmp_path / "run"
    line = _one_error_line(run_dreamer("seed=-1", f"hydra.run.dir={run_dir}"))
    assert line == "error: seed=-1 must be in [0, 2147483647]"
    assert not run_dir.exists()  # no .hydra/, no dreamer.log


def test_an_explicit_mujoco_gl_without_its_library_is_one_line_even_for_a_gymnasium_run(tmp_path):
    """experiment=smoke renders with pygame, yet MUJOCO_GL=osmesa without libOSMesa ended in PyOpenGL's
    traceback: importing torchrl imports mujoco's renderer (torchrl.envs looks for mujoco.mjx).
    The library is reported missing here whatever this machine has (ctypes finds no OSMesa)."""
    run_dir = tmp_path / "run"
    launcher = ("import ctypes.util, runpy, sys\n"
                "find = ctypes.util.find_library\n"
                "ctypes.util.find_library = lambda name: None if name == 'OSMesa' else find(name)\n"
                "sys.argv = ['dreamer', *sys.argv[1:]]\n"
                "runpy.run_module('dreamer', run_name='__main__')\n")
    result = subprocess.run(
        [sys.executable, "-c", launcher, *FAST, f"hydra.run.dir={run_dir}"], cwd=ROOT,
        env={**dreamer_env(), "MUJOCO_GL": "osmesa", "PYOPENGL_PLATFORM": "osmesa"},
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert _one_error_line(result) == ("error: MUJOCO_GL=osmesa but libOSMesa is not installed: install libosmesa6, "
                                       "or unset MUJOCO_GL to use a backend that renders here")
    assert not run_dir.exists()


@pytest.mark.timeout(300)  # the first one also makes the finished run
def test_resuming_a_finished_run_is_one_line_naming_the_key_to_raise_and_changes_nothing(finished_run, tmp_path):
    """It made more updates, evaluated a second time and overwrote summary.json."""
    before = _tree(finished_run)
    result = run_dreamer(f"resume={finished_run}", f"hydra.run.dir={tmp_path / 'out'}")
    line = _one_error_line(result)
    assert line.startswith(f"error: resume={finished_run}: the run is finished (frames=200 of "
                           "train.total_frames=200); to train it further raise train.total_frames"), line
    assert _tree(finished_run) == before


@pytest.mark.timeout(300)
def test_resuming_a_run_directory_that_cannot_be_written_is_one_line(finished_run, tmp_path):
    before = _tree(finished_run)
    with read_only(finished_run):
        result = run_dreamer(f"resume={finished_run}", "train.total_frames=400", f"hydra.run.dir={tmp_path / 'out'}")
    line = _one_error_line(result)
    assert line.startswith(f"error: resume={finished_run} cannot be written ("), line
    assert _tree(finished_run) == before and not (tmp_path / "out").exists()


REFUSED_PROCESSES = {
    "a bad key in a sweep (it left multirun.yaml)": (("-m", "seed=0,1", "algo.nope=1"), {},
                                                     "error: unknown config key algo.nope; "),
    "a MUJOCO_GL mujoco refuses (it was mujoco's traceback)": (
        ("env=dmc",), {"MUJOCO_GL": "nonsense"}, "error: MUJOCO_GL=nonsense is refused by mujoco ("),
    "resume of a directory that does not exist (it left outputs/)": (
        ("resume=no/such/run",), {}, "error: resume=no/such/run: no such directory"),
}
if not torch.cuda.is_available():
    REFUSED_PROCESSES["device=cuda without CUDA (it left outputs/)"] = (("device=cuda",), {}, "error: device=cuda but")


@pytest.mark.parametrize("case", list(REFUSED_PROCESSES))
def test_a_refused_process_leaves_its_working_directory_empty(case, tmp_path):
    args, environ, line = REFUSED_PROCESSES[case]
    result = run_dreamer(*args, cwd=tmp_path, env={**dreamer_env(), **environ})
    assert _one_error_line(result).startswith(line)
    assert list(tmp_path.iterdir()) == []


def test_the_dry_run_prints_the_config_and_writes_nothing(tmp_path):
    result = run_dreamer("--check", "experiment=smoke", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "# checked, nothing refused" in result.stdout and "\nalgo:\n  name: dreamer_v1\n" in result.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(300)
def test_a_resume_without_hydra_run_dir_writes_only_into_the_run_it_resumes(finished_run, tmp_path):
    """It created outputs/<experiment>/<now>/ (.hydra/, dreamer.log) in the working directory."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    started_as = _tree(run_dir / ".hydra")
    work = tmp_path / "work"
    work.mkdir()
    result = run_dreamer(f"resume={run_dir}", "train.total_frames=300", cwd=work)
    assert result.returncode == 0, result.stderr[-3000:]
    assert list(work.iterdir()) == []
    assert _tree(run_dir / ".hydra") == started_as  # how the run was started, kept
    assert "resumed from" in (run_dir / "dreamer.log").read_text()

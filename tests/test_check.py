"""dreamer/check.py: `dreamer --check ARGS` and `dreamer ARGS` refuse alike, before anything is created.

Every refused input of docs/RELIABILITY.md (and of issue 57) runs here in-process through the
entry point (dreamer.__main__.run, Hydra replaced by a stand-in that fails the test were the
checks to pass), from a fresh working directory: one `error:` line, exit status 2, and not a
file or directory under that directory added, removed or changed (no run directory, .hydra/,
dreamer.log, run.lock, multirun.yaml; a resumed run byte for byte as it was). Each runs both
as the run and as the dry run. tests/e2e/test_bad_inputs_up_front.py runs a few as real processes.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import dataclasses
import hashlib
import pathlib
import shutil
import sys
from pathlib import Path
from typing import Callable

import pytest
import torch
from omegaconf import OmegaConf

import dreamer.__main__ as entry
from dreamer.check import check_command_line
from dreamer.config import load_config, to_dict
from dreamer.config.compose import compose_overrides
from dreamer.run import checkpoint as ckpt
from dreamer.run import lock as run_lock
from tests.config.test_up_front_checks import read_only
from tests.run.test_checkpoint_integrity import _deflated_bomb
from tests.support.runs import saved_run, write_sealed

TOTAL_FRAMES = load_config({}).train.total_frames


def _newest(run_dir: Path) -> Path:
    return ckpt.list_checkpoints(run_dir)[-1]


def _out_of_memory(*args, **kwargs):
    raise MemoryError


_FIND_LIBRARY = ctypes.util.find_library


def _hide_osmesa(name: str):
    """ctypes as on a machine without libosmesa6."""
    return None if name == "OSMesa" else _FIND_LIBRARY(name)


def _little_disk(path):
    return shutil._ntuple_diskusage(2**20, 2**20 - 2**16, 2**16)  # 64 KiB free


@dataclasses.dataclass(frozen=True)
class Refusal:
    args: Callable[[Path], list[str]]  # the command line's arguments, given the working directory
    line: Callable[[Path], str]  # how its one line starts, after "error: "
    setup: Callable[[Path, pytest.MonkeyPatch, contextlib.ExitStack], None] | None = None


def _fixed(*args: str) -> Callable[[Path], list[str]]:
    return lambda tmp: list(args)


def _says(text: str) -> Callable[[Path], str]:
    return lambda tmp: text


RUN = "run"  # a run directory under the working directory: tmp / RUN

REFUSALS = {
    # docs/RELIABILITY.md, run directories and checkpoints
    "resume of a run in use": Refusal(
        lambda tmp: [f"resume={tmp / RUN}"], lambda tmp: f"resume={tmp / RUN} is in use by another run (pid ",
        lambda tmp, mp, stack: (saved_run(tmp / RUN), stack.enter_context(run_lock.hold(tmp / RUN, "resume")))),
    "a second run into a directory in use": Refusal(
        lambda tmp: [f"hydra.run.dir={tmp / RUN}"], lambda tmp: f"hydra.run.dir={tmp / RUN} is in use by another run",
        lambda tmp, mp, stack: ((tmp / RUN).mkdir(), stack.enter_context(run_lock.hold(tmp / RUN)))),
    "a run directory that cannot be written": Refusal(
        lambda tmp: [f"hydra.run.dir={tmp / 'ro' / RUN}"], lambda tmp: f"hydra.run.dir={tmp / 'ro' / RUN} cannot be "
        "written (", lambda tmp, mp, stack: ((tmp / "ro").mkdir(), stack.enter_context(read_only(tmp / "ro")))),
    "a missing compile.cache_artifact on the resume command line": Refusal(
        lambda tmp: [f"resume={tmp / RUN}", f"compile.cache_artifact={tmp / 'nope.bin'}"],
        lambda tmp: f"compile.cache_artifact={tmp / 'nope.bin'} does not exist",
        lambda tmp, mp, stack: saved_run(tmp / RUN)),
    "a checkpoint that needs Python objects unpickled": Refusal(
        lambda tmp: [f"resume={tmp / RUN}"],
        lambda tmp: f"checkpoint {_newest(tmp / RUN)} needs Python objects unpickled",
        lambda tmp, mp, stack: write_sealed(_newest(saved_run(tmp / RUN)), {"x": pathlib.PurePosixPath("x")})),
    "a crafted checkpoint that would inflate in memory": Refusal(
        lambda tmp: [f"resume={tmp / RUN}"], lambda tmp: f"checkpoint {_newest(tmp / RUN)} ",
        lambda tmp, mp, stack: _deflated_bomb(_newest(saved_run(tmp / RUN)), 100 * 2**20)),
    "out of memory while loading a checkpoint": Refusal(
        lambda tmp: [f"resume={tmp / RUN}"], lambda tmp: f"resume={tmp / RUN}: ran out of memory loading",
        lambda tmp, mp, stack: (saved_run(tmp / RUN), mp.setattr(ckpt.torch, "load", _out_of_memory))),
    "every checkpoint unreadable": Refusal(
        lambda tmp: [f"resume={tmp / RUN}"], lambda tmp: f"resume={tmp / RUN}: every checkpoint is unreadable (",
        lambda tmp, mp, stack: _newest(saved_run(tmp / RUN)).write_bytes(b"not a checkpoint")),
    "checkpoint.replay=true on a disk too small for one": Refusal(
        lambda tmp: ["checkpoint.replay=true", f"hydra.run.dir={tmp / RUN}"],
        _says("checkpoint.replay=true: a checkpoint with the full replay buffer takes about"),
        lambda tmp, mp, stack: mp.setattr(shutil, "disk_usage", _little_disk)),
    # docs/RELIABILITY.md, bad inputs
    "gamma 1": Refusal(_fixed("algo=dreamer_v3", "algo.gamma=1"), _says("algo.gamma=1.0 must be in (0, 1)")),
    "gamma above 1": Refusal(_fixed("algo=dreamer_v3", "algo.gamma=1.5"), _says("algo.gamma=1.5 must be in (0, 1)")),
    "lambda below 0": Refusal(_fixed("algo.lmbda=-0.5"), _says("algo.lmbda=-0.5 must be in [0.0, 1.0]")),
    "negative seed": Refusal(_fixed("seed=-1"), _says("seed=-1 must be in [0, 2147483647]")),
    "sticky actions above 1": Refusal(_fixed("env.sticky_action_prob=2"),
                                      _says("env.sticky_action_prob=2.0 must be in [0.0, 1.0]")),
    "a replay smaller than the first update": Refusal(
        _fixed("experiment=smoke", "buffer.capacity=50"),
        _says("buffer.capacity=50 cannot hold what the first update needs")),
    "a run that ends before learning starts": Refusal(
        _fixed("experiment=smoke", "train.total_frames=150"),
        _says("train.total_frames=150 ends before learning starts")),
    "a repval gradient without the joint update": Refusal(
        _fixed("algo.joint_update=false"),
        _says("algo.repval_grad=true trains the world model from the replay-value loss")),
    "the old name of the compiled-losses path": Refusal(
        _fixed("compile.update=card"), _says("compile.update=card was renamed: use compile.update=losses")),
    "resume of a finished run": Refusal(
        lambda tmp: [f"resume={tmp / RUN}"],
        lambda tmp: f"resume={tmp / RUN}: the run is finished (frames={TOTAL_FRAMES} of train.total_frames="
                    f"{TOTAL_FRAMES}); to train it further raise train.total_frames",
        lambda tmp, mp, stack: saved_run(tmp / RUN, frames=TOTAL_FRAMES)),
    "resume of a directory that cannot be written": Refusal(
        lambda tmp: [f"resume={tmp / RUN}"], lambda tmp: f"resume={tmp / RUN} cannot be written (",
        lambda tmp, mp, stack: (saved_run(tmp / RUN), stack.enter_context(read_only(tmp / RUN)))),
    "MUJOCO_GL=osmesa without libOSMesa": Refusal(
        _fixed("experiment=smoke"), _says("MUJOCO_GL=osmesa but libOSMesa is not installed: install libosmesa6"),
        lambda tmp, mp, stack: (mp.setenv("MUJOCO_GL", "osmesa"),
                                mp.setattr("ctypes.util.find_library", _hide_osmesa))),
    "a numeric key outside its domain": Refusal(_fixed("train.train_ratio=nan"),
                                                _says("train.train_ratio=nan must be")),
    # issue 57
    "an open-loop context as long as the sequences": Refusal(
        _fixed("experiment=smoke", "eval.openloop_context=10"),
        _says("eval.openloop_context=10 leaves no step to predict in buffer.batch_length=10 sequences")),
    "resume of a directory that does not exist": Refusal(
        lambda tmp: [f"resume={tmp / 'nope'}"], lambda tmp: f"resume={tmp / 'nope'}: no such directory"),
    "a bad key in a sweep": Refusal(_fixed("-m", "seed=0,1", "algo.nope=1"), _says("unknown config key algo.nope")),
    "a bad value in one job of a sweep": Refusal(_fixed("-m", "seed=0,-1"),
                                                 _says("seed=-1 must be in [0, 2147483647]")),
    "a MUJOCO_GL mujoco refuses": Refusal(
        _fixed("env=dmc"), _says("MUJOCO_GL=nonsense is refused by mujoco (RuntimeError: invalid value for environment "
                                 "variable MUJOCO_GL: nonsense)"),
        lambda tmp, mp, stack: mp.setenv("MUJOCO_GL", "nonsense")),
    "a MUJOCO_GL mujoco takes and dm_control refuses, for a DMC env": Refusal(
        _fixed("env=dmc_proprio", "env.name=cartpole-balance"),
        _says("MUJOCO_GL=glx is refused by dm_control (RuntimeError: Environment variable MUJOCO_GL must be one of "),
        lambda tmp, mp, stack: mp.setenv("MUJOCO_GL", "glx")),
    "an unknown key": Refusal(_fixed("algo.nope=1"), _says("unknown config key algo.nope")),
    "a renamed preset": Refusal(_fixed("experiment=pendulum"), _says("experiment=pendulum was renamed: use "
                                                                    "experiment=small")),
    "a pathwise actor gradient for discrete actions": Refusal(
        _fixed("env=gym", "env.name=CartPole-v1", "algo.actor_grad=dynamics"),
        _says("algo.actor_grad=dynamics needs continuous actions, and this env's are discrete")),
    "an env.import that fails": Refusal(_fixed("env.import=no_such_pkg.envs"),
                                        _says("env.import=no_such_pkg.envs: cannot import it")),
    "a missing extra (dm_control)": Refusal(
        _fixed("env=dmc_proprio", "env.name=cartpole-balance"),
        _says("dm_control is not installed ("),
        lambda tmp, mp, stack: mp.setitem(sys.modules, "dm_control", None)),  # `import dm_control` raises
    "videos without imageio-ffmpeg": Refusal(
        _fixed("eval.video=true"), _says("videos need imageio-ffmpeg, which is not installed"),
        lambda tmp, mp, stack: mp.setitem(sys.modules, "imageio_ffmpeg", None)),
    "a profiling window that is not FIRST-LAST": Refusal(
        _fixed(), _says("PROF_ITERATIONS='soon' must be FIRST-LAST learner updates"),
        lambda tmp, mp, stack: mp.setenv("PROF_ITERATIONS", "soon")),
    "a size preset on Dreamer V1": Refusal(_fixed("model=size12m", "algo=dreamer_v1"),
                                           _says("model=size12m is a DreamerV3 size preset, but algo.name=dreamer_v1")),
    # more the run refused only after Hydra had created its directory
    "an env name the backend does not know": Refusal(_fixed("env=gym", "env.name=NoSuchEnv-v0"),
                                                     _says("unknown gymnasium env 'NoSuchEnv-v0'; available: ")),
    "a fresh run into a run that can be resumed": Refusal(
        lambda tmp: [f"hydra.run.dir={tmp / RUN}"], lambda tmp: f"{tmp / RUN} already holds checkpoints of a run",
        lambda tmp, mp, stack: saved_run(tmp / RUN)),
    "a resume that changes a saved key": Refusal(
        lambda tmp: [f"resume={tmp / RUN}", "buffer.batch_size=8"],
        lambda tmp: f"resume={tmp / RUN} keeps the run's saved config; refused override: buffer.batch_size",
        lambda tmp, mp, stack: saved_run(tmp / RUN)),
    "a captured update on the CPU": Refusal(_fixed("device=cpu", "compile=on", "compile.update=captured"),
                                            _says("compile.update=captured replays the update from CUDA graphs")),
}
if not torch.cuda.is_available():  # asking for CUDA where there is none is the user's mistake
    REFUSALS["device=cuda without CUDA"] = Refusal(_fixed("device=cuda"), _says("device=cuda but "))
    REFUSALS["page-locked replay without CUDA"] = Refusal(_fixed("buffer.pin_memory=on"),
                                                          _says("buffer.pin_memory=on needs CUDA"))


def tree(root: Path) -> dict[str, tuple]:
    """Every file and directory under ``root``: a file's size, modification time and digest."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            stat = path.stat()
            found[str(path.relative_to(root))] = (stat.st_size, stat.st_mtime_ns,
                                                  hashlib.sha256(path.read_bytes()).hexdigest())
        else:
            found[str(path.relative_to(root)) + "/"] = ()
    return found


@pytest.fixture
def in_fresh_directory(tmp_path, monkeypatch):
    """A fresh working directory (where Hydra would create outputs/ and multirun/), the
    process environment restored afterwards, and contexts a case holds open until the end."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    for name in ("PYTHONWARNINGS", "RL_LOGGING_LEVEL", "MUJOCO_GL", "PYOPENGL_PLATFORM", entry.VERBOSE_ENV):
        if name in entry.os.environ:  # the entry point sets some of them: put back as they were
            monkeypatch.setenv(name, entry.os.environ[name])
        else:
            monkeypatch.delenv(name, raising=False)
    with contextlib.ExitStack() as stack:
        yield work, stack


def run_entry_point(args: list[str], monkeypatch) -> None:
    """``dreamer ARGS`` through the entry point, with a Hydra that fails the test if reached."""
    def hydra_reached(checked):
        pytest.fail("every check passed: Hydra would start the run")

    monkeypatch.setattr(entry, "hydra_entry", hydra_reached)
    monkeypatch.setattr(sys, "argv", ["dreamer", *args])
    entry.run()


@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "--check"])
@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_refusal_is_one_line_and_leaves_the_disk_as_it_was(case, dry_run, in_fresh_directory, monkeypatch,
                                                              capsys):
    work, stack = in_fresh_directory
    refusal = REFUSALS[case]
    if refusal.setup is not None:
        refusal.setup(work, monkeypatch, stack)
    before = tree(work)
    with pytest.raises(SystemExit) as exit_info:
        run_entry_point(["--check"] * dry_run + refusal.args(work), monkeypatch)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: " + refusal.line(work)), err[-2000:]
    assert tree(work) == before


def test_the_dry_run_prints_the_config_the_run_trains_with_and_writes_nothing(in_fresh_directory, monkeypatch,
                                                                               capsys):
    work, _ = in_fresh_directory
    run_entry_point(["--check", "experiment=smoke", "seed=3"], monkeypatch)
    out = capsys.readouterr().out
    expected = to_dict(load_config(compose_overrides(["experiment=smoke", "seed=3"])))
    assert OmegaConf.to_container(OmegaConf.create(out)) == expected
    assert "# checked, nothing refused: the run writes into outputs/smoke/" in out
    assert list(work.iterdir()) == []


def test_the_dry_run_of_a_resume_prints_the_saved_config_with_the_allowed_overrides(in_fresh_directory, monkeypatch,
                                                                                    capsys):
    work, _ = in_fresh_directory
    run_dir = saved_run(work / RUN)
    before = tree(work)
    run_entry_point(["--check", f"resume={run_dir}", "train.total_frames=40000"], monkeypatch)
    printed = OmegaConf.to_container(OmegaConf.create(capsys.readouterr().out))
    assert printed["train"]["total_frames"] == 40000 and printed["resume"] == str(run_dir)
    assert tree(work) == before


def test_the_run_hands_hydra_what_the_checks_found(in_fresh_directory, monkeypatch):
    """One run starts from the checked config (a resume: in the run it resumes, whose .hydra/
    record of how it started stays); a sweep's jobs check themselves as they start."""
    work, _ = in_fresh_directory
    run_dir = saved_run(work / RUN)
    handed = []
    monkeypatch.setattr(entry, "hydra_entry", lambda checked: lambda: handed.append((checked, list(sys.argv[1:]))))
    monkeypatch.setattr(sys, "argv", ["dreamer", f"resume={run_dir}", "train.total_frames=40000"])
    entry.run()
    checked, argv = handed[-1]
    assert checked.resumed_state is not None and checked.cfg.train.total_frames == 40000
    assert argv == [f"resume={run_dir}", "train.total_frames=40000", f"hydra.run.dir='{run_dir}'",
                    "hydra.output_subdir=null"]
    monkeypatch.setattr(sys, "argv", ["dreamer", "-m", "seed=0,1"])
    entry.run()
    assert handed[-1] == (None, ["-m", "seed=0,1"])


def test_a_sweep_a_launcher_runs_elsewhere_leaves_the_machine_checks_to_its_jobs(in_fresh_directory):
    """Submitting from a login node without a GPU: the jobs ask for one, and get it on theirs."""
    checked = check_command_line(["-m", "hydra/launcher=slurm", "device=cuda", "seed=0,1"])
    assert [job for job, _ in checked.jobs] == [["hydra/launcher=slurm", "device=cuda", "seed=0"],
                                               ["hydra/launcher=slurm", "device=cuda", "seed=1"]]
    assert all(found.device is None for _, found in checked.jobs)
    here = check_command_line(["-m", "seed=0,1"])  # Hydra's basic launcher: the jobs run in this process
    assert all(found.device is not None for _, found in here.jobs)

"""One `error:` line (exit 2) for each mistake a user can make, in-process: the same code
path `python -m dreamer` takes before Hydra starts (dreamer.check.check_command_line: Hydra
composition -> load_config -> the run's up-front checks, inside
dreamer.__main__.one_line_on_user_error). tests/e2e/ keeps one process per error layer;
every other case is here, and tests/test_check.py checks the disk after each refusal."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from dreamer.__main__ import one_line_on_user_error
from dreamer.check import check_command_line
from dreamer.config import AlgoConfig, EnvConfig, load_config
from dreamer.config.compose import RENAMED_OPTIONS, RETIRED_OPTIONS, compose_overrides
from tests.support.paths import CONF_DIR


def _a_file(tmp_path: Path) -> Path:
    path = tmp_path / "a_file"
    path.write_text("not a directory")
    return path


def _one_line(overrides: list[str], tmp_path: Path, capsys) -> str:
    """What `python -m dreamer OVERRIDES` ends with before Hydra starts: its stderr's one
    `error:` line; nothing is written (no run directory)."""
    if not any(o.startswith("hydra.run.dir=") for o in overrides):
        overrides = [*overrides, f"hydra.run.dir={tmp_path / 'run'}"]
    run_dir = Path(next(o for o in overrides if o.startswith("hydra.run.dir=")).partition("=")[2])
    with pytest.raises(SystemExit) as exit_info, one_line_on_user_error():
        check_command_line(overrides)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert not run_dir.exists()
    return lines[0]


# (overrides, message) -- tmp_path-dependent overrides are callables.
BAD_INPUTS = {
    # preflight: Hydra composition and the run dir, before Hydra runs
    "invalid choice": (["compile.backend=tvm"],
                       "compile.backend='tvm' is not allowed; choose one of: inductor, aot_eager, eager"),
    "unknown env preset": (["env=nope"], "Could not find 'env/nope'; choose env= one of: atari, dmc,"),
    "unknown key": (["buffer.nosuch=1"], "Could not override 'buffer.nosuch': Key 'nosuch' not in"),
    "wrong type": (["buffer.batch_size=abc"], "Value 'abc' of type 'str' could not be converted to Integer"),
    "unknown size preset": (["algo=dreamer_v3", "model=size13m"],
                            "Could not find 'model/size13m'; choose model= one of: size100m, size12m, size1m,"),
    "group set to null": (["model=null"], "to leave model unset write ~model, not model=null"),
    "unwritable output dir": (lambda tmp: [f"hydra.run.dir={_a_file(tmp)}/run"], "cannot be written (Not a directory)"),
    # load_config: values and cross-field rules
    "mode with options": (["compile.mode=default"], "compile.mode=default and compile.options are both set"),
    "negative size": (["buffer.capacity=-5"], "buffer.capacity=-5 must be > 0"),
    "repval gradient without the joint update": (
        ["algo.joint_update=false"],
        "algo.repval_grad=true trains the world model from the replay-value loss, which only the joint update can"),
    "size preset with V1": (["experiment=small_v1", "model=size12m"],
                            "model=size12m is a DreamerV3 size preset, but algo.name=dreamer_v1: add algo=dreamer_v3"),
    "key of the other algorithm": (["experiment=small_v1", "algo.free_bits=2"],
                                   "algo.free_bits is a dreamer_v3 key, but algo.name=dreamer_v1: "
                                   "add algo=dreamer_v3 or drop it"),
    # the run's up-front checks (dreamer.run.preflight)
    "open-loop context as long as the sequences": (
        ["env=pendulum_pixels", "eval.openloop_context=16"],
        "eval.openloop_context=16 leaves no step to predict in buffer.batch_length=16 sequences"),
    "resume without checkpoint": (lambda tmp: [f"resume={tmp}"], "no checkpoint in"),
    "missing env.import module": (["env.import=no_such_pkg.envs"],
                                  "env.import=no_such_pkg.envs: cannot import it (No module named 'no_such_pkg')"),
}
if torch.version.cuda is None:  # the CPU wheel CI installs: asking for CUDA is the user's mistake
    BAD_INPUTS["cuda on a CPU-only torch"] = (["device=cuda"], "device=cuda but this torch")


@pytest.fixture(autouse=True)
def no_full_errors(monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_clear_line(case, tmp_path, capsys):
    overrides, message = BAD_INPUTS[case]
    if callable(overrides):
        overrides = overrides(tmp_path)
    line = _one_line(overrides, tmp_path, capsys)
    assert message in line, line


@pytest.mark.parametrize("group, old, new", [(g, old, new) for g, names in sorted(RENAMED_OPTIONS.items())
                                               for old, new in sorted(names.items())])
def test_a_renamed_option_is_one_line_naming_its_new_name(group, old, new, tmp_path, capsys):
    load_config(compose_overrides([f"{group}={new}"]))  # the new name is a real option
    assert not (CONF_DIR / group / f"{old}.yaml").exists()
    line = _one_line([f"{group}={old}", "seed=1"], tmp_path, capsys)
    assert line == f"error: {group}={old} was renamed: use {group}={new}"


@pytest.mark.parametrize("group, old", [(g, old) for g, names in sorted(RETIRED_OPTIONS.items()) for old in names])
def test_a_retired_option_is_one_line_saying_what_to_do(group, old, tmp_path, capsys):
    assert not (CONF_DIR / group / f"{old}.yaml").exists()
    line = _one_line([f"{group}={old}"], tmp_path, capsys)
    assert line == f"error: {group}={old} was retired: {RETIRED_OPTIONS[group][old]}"


@pytest.mark.parametrize("backend, module, name, extra", [
    ("dm_control", "dm_control", "cartpole-balance", "pip install 'dreamer[dmc]'"),
    ("atari", "ale_py", "Pong", "pip install 'dreamer[atari]'"),
])
def test_a_missing_optional_dependency_is_one_line_naming_the_extra(backend, module, name, extra, monkeypatch,
                                                                      capsys):
    """The env factory's error path, as when the extra is not installed (the module cannot be imported)."""
    from dreamer.envs.factory import make_env

    monkeypatch.setitem(sys.modules, module, None)  # `import MODULE` now raises ImportError
    env_cfg = EnvConfig(backend=backend, name=name, from_pixels=True)
    algo_cfg = load_config({}).algo
    assert isinstance(algo_cfg, AlgoConfig)
    with pytest.raises(SystemExit) as exit_info, one_line_on_user_error():
        make_env(env_cfg, algo_cfg)
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {module} is not installed (") and extra in lines[0], lines


@pytest.mark.parametrize("videos", [["eval.video=true"], ["eval.video=false"]],
                         ids=["eval video", "open-loop video alone"])
def test_videos_without_imageio_ffmpeg_are_one_line_before_the_run_starts(videos, tmp_path, monkeypatch, capsys):
    """Without the ffmpeg plugin the first evaluation's video would fail mid-run (on a GPU box
    imageio picked tifffile for .mp4 and the smoke run died at its first evaluation)."""
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # `import imageio_ffmpeg` now raises ImportError
    line = _one_line(["experiment=smoke", "compile=off", *videos], tmp_path, capsys)
    assert "videos need imageio-ffmpeg" in line and "eval.video=false eval.openloop=false" in line, line
    assert not list((tmp_path / "run").rglob("*.pt"))  # nothing of a run was written

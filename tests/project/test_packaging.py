"""A wheel of the project runs `python -m dreamer` anywhere, configs included.

The top-level conf/ is where configs are edited; the wheel ships a copy under
<prefix>/share/dreamer/conf (pyproject.toml's data-files), which
dreamer/config/location.py finds when there is no checkout around it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig

import pytest
import tomllib

from tests.support.paths import REPO_ROOT

CONF = REPO_ROOT / "conf"


def test_every_conf_directory_ships_in_the_wheel():
    listed = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]
    shipped = {target.removeprefix("share/dreamer/") for target in listed}
    needed = {"conf" if d == CONF else "conf/" + d.relative_to(CONF).as_posix()
              for d in [CONF, *CONF.rglob("*")] if d.is_dir() and any(d.glob("*.yaml"))}
    assert needed <= shipped, f"add to [tool.setuptools.data-files] in pyproject.toml: {sorted(needed - shipped)}"


def _run(args, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(args, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL, **kwargs)
    assert result.returncode == 0, (args, result.stdout[-2000:], result.stderr[-3000:])
    return result


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_an_installed_wheel_runs_outside_the_checkout(tmp_path):
    """The wheel (not an editable install) in a fresh venv, started from a directory
    with no checkout: `--cfg job` composes a preset, and a tiny run trains."""
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(REPO_ROOT), "-w", str(wheels)])
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    # The fresh venv borrows this one's dependencies (torch etc.), not its dreamer:
    # a path line in a .pth adds the directory without running its .pth hooks (the editable finder).
    venv_site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    (venv / venv_site / "deps_of_the_test_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
          *map(str, wheels.glob("dreamer-*.whl"))])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HYDRA_FULL_ERROR")}
    env["SDL_VIDEODRIVER"] = "dummy"
    where = _run([str(python), "-c", "import dreamer; print(dreamer.__file__)"], cwd=elsewhere, env=env).stdout
    assert where.strip().startswith(str(venv)), where
    job = _run([str(python), "-m", "dreamer", "--cfg", "job", "experiment=smoke"], cwd=elsewhere, env=env).stdout
    assert "experiment: smoke" in job
    run_dir = elsewhere / "run"
    _run([str(python), "-m", "dreamer", "experiment=smoke", "env=pendulum", "compile=off", "train.total_frames=200",
          "collector.num_workers=0", "threads=1", "eval.video=false", "logger.progress_bar=false",
          f"hydra.run.dir={run_dir}"], cwd=elsewhere, env=env)
    assert json.loads((run_dir / "summary.json").read_text())["frames"] >= 200

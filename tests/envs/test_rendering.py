"""dreamer/envs/rendering.py: MUJOCO_GL chosen by rendering, the user's choice kept, one line when nothing renders
(and the test suite's own check, tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dreamer.envs.rendering import candidates, configure_mujoco_gl, missing_gl_library, renders
from dreamer.errors import UserError
from tests.support.gpu_checks import MUJOCO_GL_PROBE
from tests.support.paths import REPO_ROOT


class Probe:
    """A fake probe: these backends render; records what was tried."""

    def __init__(self, *working: str):
        self.working, self.tried = set(working), []

    def __call__(self, backend: str) -> bool:
        self.tried.append(backend)
        return backend in self.working


def test_an_explicit_mujoco_gl_wins_and_is_not_probed():
    environ, probe = {"MUJOCO_GL": "egl"}, Probe()
    assert configure_mujoco_gl(environ, probe=probe) == "egl"
    assert probe.tried == [] and "PYOPENGL_PLATFORM" not in environ


@pytest.mark.gpu_acceptance(MUJOCO_GL_PROBE)
def test_egl_is_used_headless_when_it_renders():
    environ, probe = {}, Probe("egl", "osmesa")
    assert configure_mujoco_gl(environ, probe=probe) == "egl"
    assert environ == {"MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl"}
    assert probe.tried == ["egl"]


@pytest.mark.gpu_acceptance(MUJOCO_GL_PROBE)
def test_osmesa_is_the_fallback_when_egl_does_not_render():
    environ, probe = {}, Probe("osmesa")
    assert configure_mujoco_gl(environ, probe=probe) == "osmesa"
    assert environ["PYOPENGL_PLATFORM"] == "osmesa" and probe.tried == ["egl", "osmesa"]


def test_glfw_is_tried_first_only_with_a_display():
    assert candidates({}) == ["egl", "osmesa"]
    environ, probe = {"DISPLAY": ":0"}, Probe("glfw", "egl")
    assert configure_mujoco_gl(environ, probe=probe) == "glfw"
    assert "PYOPENGL_PLATFORM" not in environ
    environ, probe = {"DISPLAY": ":0"}, Probe("osmesa")  # a display that glfw cannot open
    assert configure_mujoco_gl(environ, probe=probe) == "osmesa"
    assert probe.tried == ["glfw", "egl", "osmesa"]


def test_no_backend_renders_is_one_line_naming_what_to_install():
    with pytest.raises(UserError) as err:
        configure_mujoco_gl({}, probe=Probe())
    message = str(err.value)
    assert "\n" not in message
    assert "tried egl, osmesa" in message and "libegl1" in message and "libosmesa6" in message


@pytest.mark.gpu_acceptance(MUJOCO_GL_PROBE)
def test_each_rank_renders_on_its_own_gpu_under_egl():
    environ = {}
    configure_mujoco_gl(environ, egl_device=3, probe=Probe("egl"))
    assert environ["MUJOCO_EGL_DEVICE_ID"] == "3"
    environ = {"MUJOCO_EGL_DEVICE_ID": "1"}  # the user's choice stays
    configure_mujoco_gl(environ, egl_device=3, probe=Probe("egl"))
    assert environ["MUJOCO_EGL_DEVICE_ID"] == "1"
    environ = {}
    configure_mujoco_gl(environ, egl_device=3, probe=Probe("osmesa"))
    assert "MUJOCO_EGL_DEVICE_ID" not in environ


@pytest.mark.mujoco
def test_the_backend_the_session_picked_renders_and_an_unknown_one_never_does():
    # tests/conftest.py picks the backend as the app does (or keeps the user's MUJOCO_GL).
    assert renders(os.environ["MUJOCO_GL"])
    assert not renders("no-such-gl")


def test_a_missing_gl_library_is_named_with_its_install_command():
    assert "libosmesa6" in missing_gl_library({"MUJOCO_GL": "osmesa"}, lambda name: None)
    assert "libegl1" in missing_gl_library({"MUJOCO_GL": "egl"}, lambda name: None)
    assert missing_gl_library({"MUJOCO_GL": "osmesa"}, lambda name: f"lib{name}.so") is None
    assert missing_gl_library({"MUJOCO_GL": "glfw"}, lambda name: None) is None  # glfw: not checked here
    assert missing_gl_library({}, lambda name: None) is None  # unset: the probe chooses


def test_a_users_backend_without_its_library_is_one_line_not_a_pyopengl_traceback(monkeypatch):
    monkeypatch.setattr("ctypes.util.find_library", lambda name: None)
    with pytest.raises(UserError, match="MUJOCO_GL=osmesa but libOSMesa is not installed") as err:
        configure_mujoco_gl({"MUJOCO_GL": "osmesa"}, probe=Probe("osmesa"))
    assert "\n" not in str(err.value)


@pytest.mark.timeout(300)
@pytest.mark.slow  # a pytest session of its own
def test_the_test_session_skips_rendering_tests_with_the_reason_when_the_users_backend_is_missing(tmp_path):
    """A box without libosmesa6 and MUJOCO_GL=osmesa set: the suite runs, tests that render MuJoCo skip
    saying what to install (they used to stop the whole session)."""
    # sitecustomize hides libOSMesa from ctypes, as on a box without libosmesa6.
    (tmp_path / "sitecustomize.py").write_text(
        "import ctypes.util\n"
        "_find = ctypes.util.find_library\n"
        "ctypes.util.find_library = lambda name: None if name == 'OSMesa' else _find(name)\n"
    )
    env = {**os.environ, "MUJOCO_GL": "osmesa", "PYOPENGL_PLATFORM": "osmesa", "PYTHONPATH": str(tmp_path)}
    test = "tests/envs/test_rendering.py::test_the_backend_the_session_picked_renders_and_an_unknown_one_never_does"
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-n", "0", test],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 skipped" in out.stdout and "libOSMesa is not installed" in out.stdout, out.stdout

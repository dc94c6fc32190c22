"""MuJoCo's OpenGL backend (``MUJOCO_GL``), chosen once per run by trying to render.

dm_control renders through whichever backend ``MUJOCO_GL`` names, and a
backend whose library is missing fails deep inside PyOpenGL (``'NoneType'
object has no attribute 'glGetError'``), or crashes. So an unset
``MUJOCO_GL`` is resolved by rendering a tiny scene in a throwaway
subprocess with each candidate in turn -- glfw (only with a display), egl
(GPU or Mesa), osmesa (software) -- and the first that renders is set in
``os.environ``, which spawned collector workers inherit. A ``MUJOCO_GL`` the
user set wins and is not probed, but a headless backend whose library is not
installed, or a value mujoco refuses (or, for DMC envs, dm_control), is one error line, not a
traceback.
"""

from __future__ import annotations

import ctypes.util
import functools
import os
import subprocess
import sys
from typing import Callable, Mapping, MutableMapping

from dreamer.errors import UserError

# What each backend needs from the system, for the error when none renders.
INSTALL_HINTS = {
    "glfw": "a display and libglfw3",
    "egl": "libegl1 (with a GPU driver or Mesa)",
    "osmesa": "libosmesa6",
}

# The shared library each headless backend loads through PyOpenGL (what it asks ctypes for).
GL_LIBRARIES = {"osmesa": "OSMesa", "egl": "EGL"}

_PROBE = """
import mujoco
model = mujoco.MjModel.from_xml_string('<mujoco><worldbody><geom size="1"/></worldbody></mujoco>')
renderer = mujoco.Renderer(model, 8, 8)
assert renderer.render().shape == (8, 8, 3)
print("rendered")
"""


def renders(backend: str, timeout: float = 60.0) -> bool:
    """True when MuJoCo renders an 8x8 frame with ``MUJOCO_GL=backend``, tried in
    a subprocess (a broken GL library can crash the process that loads it)."""
    env = {**os.environ, "MUJOCO_GL": backend, "PYOPENGL_PLATFORM": backend}
    if backend == "glfw":
        env.pop("PYOPENGL_PLATFORM")
    try:
        out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return out.returncode == 0 and "rendered" in out.stdout


def missing_gl_library(environ: Mapping[str, str], find_library: Callable[[str], str | None] | None = None,
                       ) -> str | None:
    """One line saying what to install when ``MUJOCO_GL`` names a headless backend whose library is
    absent (dm_control would fail deep inside PyOpenGL with ``'NoneType' object has no attribute
    'glGetError'``); None when it is there or not checkable (glfw needs a display, not a library).
    ``find_library``: how ctypes finds a library (looked up when called)."""
    find_library = find_library or ctypes.util.find_library
    backend = environ.get("MUJOCO_GL", "")
    if backend not in GL_LIBRARIES or find_library(GL_LIBRARIES[backend]) is not None:
        return None
    return (f"MUJOCO_GL={backend} but lib{GL_LIBRARIES[backend]} is not installed: install "
            f"{INSTALL_HINTS[backend]}, or unset MUJOCO_GL to use a backend that renders here")


def refused_at_import(backend: str, module: str = "mujoco", timeout: float = 60.0) -> str | None:
    """The complaint (its last line) when importing ``module`` with ``MUJOCO_GL=backend``
    fails, asked in a subprocess: this process may have imported it already."""
    env = {**os.environ, "MUJOCO_GL": backend}
    try:
        out = subprocess.run([sys.executable, "-c", f"import {module}"], env=env, capture_output=True, text=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"importing {module} did not finish in {timeout:.0f} s"
    if out.returncode == 0:
        return None
    return next((line.strip() for line in reversed(out.stderr.splitlines()) if line.strip()), "import failed")


def mujoco_refuses(backend: str) -> str | None:
    return refused_at_import(backend, "mujoco")


@functools.cache
def dm_control_refuses(backend: str) -> str | None:
    """dm_control's complaint about ``MUJOCO_GL=backend``: it knows fewer values than mujoco
    (``glx`` is mujoco's, not dm_control's) and raises when its first env is built."""
    return refused_at_import(backend, "dm_control._render")


def gl_environment_problem(environ: Mapping[str, str], refuses: Callable[[str], str | None] = mujoco_refuses,
                           ) -> str | None:
    """One line when ``MUJOCO_GL`` cannot work here, whatever the env: importing torchrl
    imports mujoco, which refuses a backend it does not know (``invalid value for
    environment variable MUJOCO_GL``) and loads the named backend's library. None when
    it is unset, names a backend whose library is there, or is a value mujoco accepts."""
    if problem := missing_gl_library(environ):
        return problem
    backend = environ.get("MUJOCO_GL")
    if backend is None or backend in INSTALL_HINTS:
        return None
    reason = refuses(backend)
    if reason is None:
        return None
    return (f"MUJOCO_GL={backend} is refused by mujoco ({reason}): set MUJOCO_GL=egl, osmesa or glfw, "
            "or unset it to use a backend that renders here")


def candidates(environ: Mapping[str, str]) -> list[str]:
    """Backends worth trying here, best first: glfw needs a display."""
    return (["glfw"] if environ.get("DISPLAY") else []) + ["egl", "osmesa"]


def configure_mujoco_gl(environ: MutableMapping[str, str] | None = None, *, egl_device: int | None = None,
                        probe: Callable[[str], bool] = renders) -> str:
    """Set ``MUJOCO_GL`` (and ``PYOPENGL_PLATFORM``) to a backend that renders here;
    returns it. ``egl_device``: the GPU this rank renders on when EGL is used
    (``MUJOCO_EGL_DEVICE_ID``, unless already set), so ranks do not all render on
    GPU 0. Raises UserError naming what to install when none renders, or when the backend the user
    named lacks its library or is a value dm_control refuses."""
    environ = os.environ if environ is None else environ
    backend = environ.get("MUJOCO_GL")
    if problem := missing_gl_library(environ):
        raise UserError(problem)
    if backend is not None and backend not in INSTALL_HINTS and (reason := dm_control_refuses(backend)):
        raise UserError(f"MUJOCO_GL={backend} is refused by dm_control ({reason}): set MUJOCO_GL=egl, osmesa "
                        "or glfw, or unset it to use a backend that renders here")
    if backend is None:
        tried = candidates(environ)
        backend = next((b for b in tried if probe(b)), None)
        if backend is None:
            needs = ", ".join(f"{b}: {INSTALL_HINTS[b]}" for b in tried)
            raise UserError(
                f"MuJoCo cannot render here with any OpenGL backend (tried {', '.join(tried)}); install one "
                f"({needs}; on Debian/Ubuntu: apt-get install libosmesa6), or set MUJOCO_GL"
            )
        environ["MUJOCO_GL"] = backend
        if backend != "glfw":
            environ.setdefault("PYOPENGL_PLATFORM", backend)
    if backend == "egl" and egl_device is not None:
        environ.setdefault("MUJOCO_EGL_DEVICE_ID", str(egl_device))
    return backend

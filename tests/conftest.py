"""What every test session shares: headless rendering chosen the way the app chooses it, the
markers' meaning applied by folder and by capability, and fixtures that set up and tear down
state (one intra-op thread, a stand-in for torch.cuda). Plain builders live in tests/support/."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from dreamer.envs.rendering import configure_mujoco_gl
from dreamer.errors import UserError

E2E_DIR = Path(__file__).parent / "e2e"
_no_mujoco_rendering: str | None = None


GPU_CHECK_MARKERS = ("gpu_acceptance", "cuda")
# A unit test gets pyproject's timeout; an e2e or slow test without its own @pytest.mark.timeout this one.
SLOW_TIMEOUT_S = 600


def pytest_addoption(parser):
    parser.addoption("--gpu-checks-json", metavar="PATH",
                     help="write each collected gpu_acceptance / cuda test's check name to PATH "
                          "(scripts/gpu_check.py builds its report from it)")


def pytest_configure(config):
    """Render headless as ``python -m dreamer`` does: pygame without a display, and MuJoCo's GL
    backend picked by the app's own probe (glfw, egl, osmesa), or the one MUJOCO_GL names."""
    global _no_mujoco_rendering
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    try:
        configure_mujoco_gl(os.environ)
    except UserError as err:
        _no_mujoco_rendering = str(err)


def gpu_check_of(item) -> tuple[str, str] | None:
    """(marker, check name) of a test in scripts/gpu_check.py's report, or None. A GPU test that names
    no check would never run where a GPU is (gpu_check runs tests by their check): a usage error."""
    for name in GPU_CHECK_MARKERS:
        marker = item.get_closest_marker(name)
        if marker is None:
            continue
        if not marker.args:
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{name}(CHECK) needs the name of its line in "
                                    "scripts/gpu_check.py's report (tests/support/gpu_checks.py)")
        return name, marker.args[0]
    return None


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these markers
def pytest_collection_modifyitems(config, items):
    cuda = torch.cuda.is_available()
    for item in items:
        if (check := gpu_check_of(item)) is not None:
            item.user_properties.append(("gpu_check", check[1]))  # into the JUnit XML gpu_check reads
        if E2E_DIR in Path(item.fspath).parents:
            item.add_marker(pytest.mark.e2e)
        if not item.get_closest_marker("timeout") and (item.get_closest_marker("e2e") or
                                                       item.get_closest_marker("slow")):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))
        if item.get_closest_marker("cuda") and not cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)"))
        if item.get_closest_marker("mujoco") and _no_mujoco_rendering:
            item.add_marker(pytest.mark.skip(reason=f"needs MuJoCo rendering: {_no_mujoco_rendering}"))
    items[:] = costliest_modules_first(items)


# Rough relative costs of a test by its markers, for ordering modules only.
TEST_COST = {"e2e": 25.0, "slow": 15.0, None: 0.1}


def _test_cost(item) -> float:
    return next((cost for marker, cost in TEST_COST.items() if marker and item.get_closest_marker(marker)),
                TEST_COST[None])


def costliest_modules_first(items: list) -> list:
    """``items`` with whole modules ordered by their tests' rough cost, costliest first (each
    module's tests stay together, in their order). pytest-xdist's loadscope hands each worker
    one module at a time in this order (pyproject: --no-loadscope-reorder), so the e2e and
    compiling modules start early and the many cheap ones fill in at the end, instead of
    one worker finishing alone on a long module."""
    cost: dict[str, float] = {}
    for item in items:
        cost[item.module.__name__] = cost.get(item.module.__name__, 0.0) + _test_cost(item)
    return sorted(items, key=lambda item: -cost[item.module.__name__])


def pytest_collection_finish(session):
    """The selected GPU-check tests and their check names, for scripts/gpu_check.py."""
    if path := session.config.getoption("--gpu-checks-json"):
        checks = [{"nodeid": item.nodeid, "marker": check[0], "check": check[1]}
                  for item in session.items if (check := gpu_check_of(item)) is not None]
        Path(path).write_text(json.dumps(checks, indent=1))


@pytest.fixture(scope="module")
def single_thread():
    """One intra-op thread: tiny models on a busy 2-core box are many times faster without
    OpenMP threads spinning against each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda's streams, events, host-memory registration and copies, stood in for on the CPU
    and logged in order (tests/support/fake_cuda.py)."""
    from tests.support.fake_cuda import FakeCuda

    return FakeCuda(monkeypatch)

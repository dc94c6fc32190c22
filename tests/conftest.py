"""Session checks that turn a missing system library into one line, not dozens of tracebacks."""

import pytest
from helpers_unit import missing_gl_library


def pytest_configure(config):
    problem = missing_gl_library()
    if problem:
        pytest.exit(problem, returncode=pytest.ExitCode.USAGE_ERROR)

"""dreamer/system/torch_version.py: a run on a torch outside pyproject.toml's range
says so in one line naming the range; inside it, nothing."""

from __future__ import annotations

import io
from importlib import metadata

import pytest
import tomllib
from packaging.requirements import Requirement

from dreamer.system import torch_version
from dreamer.system.torch_version import supported_torch, unsupported_torch_line, warn_if_unsupported_torch
from tests.support.paths import REPO_ROOT

PYPROJECT = REPO_ROOT / "pyproject.toml"


def _pyprojects_torch() -> Requirement:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    return next(r for r in map(Requirement, dependencies) if r.name == "torch")


def test_the_range_checked_is_pyprojects_and_the_installed_torch_lies_in_it():
    supported = supported_torch()
    assert supported == _pyprojects_torch().specifier, "reinstall: pip install -e ."
    assert supported.contains(metadata.version("torch"), prereleases=True)


@pytest.mark.parametrize("installed", ["2.11.0", "2.11.0+cu130", "2.13.0+cpu", "2.15.0", "2.15.1"])
def test_a_torch_inside_the_range_says_nothing(installed):
    assert unsupported_torch_line(installed, supported_torch()) is None


@pytest.mark.parametrize("installed", ["2.10.0", "2.11.0a0+git34c6371", "2.16.0", "2.16.0.dev20270101", "unknown"])
def test_a_torch_outside_the_range_is_one_warning_line_naming_it(installed, monkeypatch):
    monkeypatch.setattr(torch_version.metadata, "version", lambda name: installed)
    out = io.StringIO()
    warn_if_unsupported_torch(out)
    line = out.getvalue()
    assert line.count("\n") == 1 and line.startswith(f"warning: torch {installed} is outside")
    assert "torch >=2.11, <2.16" in line


def test_an_uninstalled_dreamer_checks_nothing(monkeypatch):
    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(torch_version.metadata, "requires", not_installed)
    assert supported_torch() is None
    assert unsupported_torch_line("1.0.0", None) is None

"""The torch releases dreamer supports, checked when a run starts.

The range is pyproject.toml's torch requirement, read back from the installed
package's metadata, so it is written in one place. pip keeps torch inside it; a
torch installed around pip (``--no-deps``, a cluster's own build) may not be,
and the compiled update may then not trace. The run says so in one line and
goes on. Both are read from metadata: torch itself is not imported here.
"""

from __future__ import annotations

import sys
from importlib import metadata
from typing import TextIO

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version


def supported_torch() -> SpecifierSet | None:
    """The torch range of the installed dreamer; None when dreamer runs without being installed."""
    try:
        requires = metadata.requires("dreamer") or []
    except metadata.PackageNotFoundError:
        return None
    for line in requires:
        requirement = Requirement(line)
        if requirement.name == "torch" and requirement.marker is None:
            return requirement.specifier
    return None


def describe(supported: SpecifierSet) -> str:
    """``>=2.11, <2.16``: lower bounds first."""
    return ", ".join(sorted((str(s) for s in supported), key=lambda s: not s.startswith(">")))


def unsupported_torch_line(installed: str, supported: SpecifierSet | None) -> str | None:
    """One warning line when ``installed`` lies outside ``supported``, else None."""
    if supported is None:
        return None
    try:
        inside = supported.contains(Version(installed), prereleases=True)
    except InvalidVersion:
        inside = False
    if inside:
        return None
    return (f"warning: torch {installed} is outside the range dreamer supports (torch {describe(supported)}); "
            "the compiled update may not trace: install a torch in that range (README, Install)")


def warn_if_unsupported_torch(stream: TextIO | None = None) -> None:
    try:
        installed = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return  # no torch at all: the import that needs it says so
    if line := unsupported_torch_line(installed, supported_torch()):
        print(line, file=stream or sys.stderr)

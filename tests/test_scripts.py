"""Every script in scripts/ answers --help (DESIGN: each is runnable with --help)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "scripts").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_help_describes_it_and_exits_0(script):
    result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True,
                            timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.lower().startswith("usage:") and len(result.stdout.splitlines()) > 3

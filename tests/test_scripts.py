"""Every script in scripts/ answers --help (DESIGN: each is runnable with --help).

Each script's --help runs in-process (runpy, as `python SCRIPT --help` runs it); one
runs as its own process, so a script that only works imported would still be caught."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "scripts").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_help_describes_it_and_exits_0(script, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    monkeypatch.syspath_prepend(str(script.parent))  # as `python SCRIPT` puts its directory first
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr()
    assert exit_info.value.code in (0, None), out.err[-2000:]
    assert out.out.lower().startswith("usage:") and len(out.out.splitlines()) > 3


def test_a_script_answers_help_as_its_own_process():
    script = SCRIPTS[0]
    result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True,
                            timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.lower().startswith("usage:") and len(result.stdout.splitlines()) > 3

"""tests/support/forkserver.py: a run forked from the server behaves as `python -m dreamer`
started fresh, for everything the e2e tests read (output, exit status, session, signals)."""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from tests.support.forkserver import ForkedRun
from tests.support.processes import FAST_STATES, has_updates, run_dreamer, start, wait_for

pytestmark = pytest.mark.e2e


def test_a_forked_run_prints_and_exits_as_a_fresh_one(tmp_path):
    for args in (["--cfg", "job", "experiment=smoke"], ["seed=-1", f"hydra.run.dir={tmp_path / 'run'}"]):
        fresh, forked = run_dreamer(*args, fresh=True), run_dreamer(*args)
        assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert fresh.returncode == 2 and fresh.stderr.startswith("error: seed=-1")


@pytest.mark.timeout(300)
def test_a_forked_run_leads_its_own_session_and_ends_by_its_signal(tmp_path):
    if os.environ.get("DREAMER_TESTS_EXEC") == "1":
        pytest.skip("DREAMER_TESTS_EXEC=1: every run starts a fresh interpreter, none is forked")
    run_dir = tmp_path / "run"
    run = start(*FAST_STATES, "train.total_frames=100000", f"hydra.run.dir={run_dir}")
    try:
        assert isinstance(run, ForkedRun) and psutil.Process(run.pid).ppid() != os.getpid()
        assert os.getsid(run.pid) == run.pid  # start()'s new session, as Popen's start_new_session
        wait_for(has_updates(run_dir), 240, "the run's first updates")
        assert run.poll() is None
        run.send_signal(signal.SIGKILL)
        assert run.wait(timeout=60) == -signal.SIGKILL
    finally:
        if run.poll() is None:
            run.kill()

"""The background compile child under faults (issue 45 item 10): it ends at once when told
to stop, and a child that hangs is stopped after compile.background_timeout_minutes, the run
saying so in one line and learning on eager with all its threads."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from tensordict import TensorDict

from dreamer.report.evaluation import EvalResult
from dreamer.run import compile_switch
from dreamer.run import trainer as trainer_module
from dreamer.run.background_compile import BackgroundCompile
from tests.run.test_trainer import fake_run
from tests.support.processes import wait_for

pytestmark = pytest.mark.slow  # each spawns a child interpreter that imports torch


def hang(marker: str, device, autocast_dtype, batch) -> float:
    """A compile that never ends; it first starts a helper process (as inductor's compile workers)
    and writes the helper's pid to ``marker`` (the child's ``cfg`` argument)."""
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    Path(marker).write_text(str(helper.pid))
    time.sleep(600)
    return 0.0


def _start_hanging(tmp_path: Path, timeout_s: float | None = None) -> tuple[BackgroundCompile, Path]:
    marker = tmp_path / "hanging"
    child = BackgroundCompile(str(marker), torch.device("cpu"), None, TensorDict({}, batch_size=[]), tmp_path,
                              threads=1, timeout_s=timeout_s, work=hang)
    return child, marker


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_cancelled_child_ends_at_once_with_the_processes_it_started(tmp_path):
    """The child ignored SIGTERM: every run that ended mid-compile waited the full 10 s join."""
    child, marker = _start_hanging(tmp_path)
    try:
        wait_for(marker.exists, 120, "the child to start compiling")
        helper = int(marker.read_text())
        start = time.monotonic()
        child.cancel()
        took = time.monotonic() - start
    finally:
        if child.process.is_alive():
            child.process.kill()
    assert child.process.exitcode is not None and took < 3, f"cancel took {took:.1f} s"
    wait_for(lambda: _gone(helper), 10, "the child's helper process to end")


def test_a_hung_child_is_stopped_after_its_timeout_and_reported_as_failed(tmp_path):
    child, marker = _start_hanging(tmp_path, timeout_s=20.0)
    try:
        assert child.poll() is None  # running, within its time
        wait_for(marker.exists, 120, "the child to start compiling")
        helper = int(marker.read_text())
        wait_for(lambda: time.perf_counter() - child.started > 20.0, 60, "the timeout")
        result = child.poll()
    finally:
        if child.process.is_alive():
            child.process.kill()
    assert result["error"] == ("the compile process did not finish within 20 s "
                               "(compile.background_timeout_minutes) and was stopped")
    assert not child.process.is_alive()
    wait_for(lambda: _gone(helper), 10, "the child's helper process to end")


def test_a_run_whose_compile_child_hangs_says_so_once_and_learns_on_eager_with_all_its_threads(
        tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(trainer_module, "evaluate", lambda *a, **k: EvalResult([1.0]))
    monkeypatch.setattr(trainer_module, "compiles_in_background", lambda cfg, ranks: True)
    marker = tmp_path / "hanging"
    started = []

    def start_hanging(cfg, *args, **kwargs):
        started.append(kwargs["timeout_s"])
        return BackgroundCompile(str(marker), *args, **kwargs, work=hang)

    monkeypatch.setattr(compile_switch, "BackgroundCompile", start_hanging)
    # A batch every 0.1 s: the run lasts past its child's 3 s timeout.
    run, calls = fake_run(tmp_path, batches=80, on_batch=lambda i: time.sleep(0.1))
    run.cfg.compile.background_timeout_minutes = 3.0 / 60
    run.replay.sample = lambda: TensorDict({}, batch_size=[])
    run.learner.autocast_dtype = None
    run.learner.compile = lambda: calls.update(["learner.compile"])
    threads_seen = []
    update = run.learner.update
    run.learner.update = lambda sample: (threads_seen.append(torch.get_num_threads()), update(sample))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with caplog.at_level(logging.WARNING, logger="dreamer"):
            result = trainer_module.Trainer(run).run()
    finally:
        torch.set_num_threads(threads)
    assert started == [3.0]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ["background compile failed, the losses stay eager: the compile process did not finish "
                        "within 3 s (compile.background_timeout_minutes) and was stopped"]
    assert calls["learner.compile"] == 0 and result.updates == calls["update"] == 800
    assert 1 in threads_seen and threads_seen[-1] == 2  # a thread lent to the child, then given back
    if marker.exists():  # the child reached its work before its time ran out
        wait_for(lambda: _gone(int(marker.read_text())), 10, "the child's helper process to end")

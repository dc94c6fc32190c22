"""dreamer/run/lock.py: one writer per run directory, released by the kernel when its holder dies."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from dreamer.errors import UserError
from dreamer.run import checkpoint as ckpt
from dreamer.run import lock as run_lock
from tests.support.configs import tiny_config
from tests.support.processes import FAST_STATES, ROOT, has_updates, read_metrics, start, wait_for

# A process that holds a run directory's lock until it is killed.
HOLD = ("import sys, time\nfrom dreamer.run.lock import hold\n"
        "with hold(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(600)\n")


@pytest.fixture
def holder():
    """holder(run_dir): a live process holding run_dir's lock (killed at the end of the test)."""
    procs = []

    def hold(run_dir):
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], cwd=ROOT, stdout=subprocess.PIPE,
                                text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "held"
        return proc

    yield hold
    for proc in procs:
        proc.kill()
        proc.wait()


def _snapshot(run_dir) -> dict:
    """Every file under run_dir with its content digest (what a second writer must not change)."""
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_a_second_holder_is_refused_naming_the_first_ones_pid_and_host(tmp_path, holder):
    first = holder(tmp_path)
    recorded = json.loads((tmp_path / run_lock.LOCK_NAME).read_text())
    assert recorded["pid"] == first.pid and recorded["host"] == socket.gethostname()
    with pytest.raises(run_lock.RunDirInUse) as err:
        with run_lock.hold(tmp_path):
            pass
    message = str(err.value)
    assert "\n" not in message
    assert f"pid {first.pid} on host {socket.gethostname()}" in message and f"hydra.run.dir={tmp_path}" in message
    with pytest.raises(run_lock.RunDirInUse, match=f"resume={tmp_path} is in use .*stop it first"):
        run_lock.refuse_if_held(tmp_path, "resume")


def test_the_kernel_releases_the_lock_of_a_killed_holder(tmp_path, holder):
    first = holder(tmp_path)
    first.send_signal(signal.SIGKILL)
    first.wait()
    run_lock.refuse_if_held(tmp_path)  # no stale lock
    with run_lock.hold(tmp_path) as locked:
        assert locked
        assert json.loads((tmp_path / run_lock.LOCK_NAME).read_text())["pid"] == os.getpid()


def test_the_lock_is_released_when_the_run_ends(tmp_path):
    with run_lock.hold(tmp_path):
        pass
    with run_lock.hold(tmp_path) as locked:  # the same process, the next run in it (a multirun's jobs)
        assert locked


def test_a_probe_creates_nothing(tmp_path):
    run_lock.refuse_if_held(tmp_path / "missing")
    run_lock.refuse_if_held(tmp_path)
    assert not (tmp_path / "missing").exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("code", [errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOLCK])
def test_a_file_system_without_flock_is_one_warning_not_a_crash(tmp_path, monkeypatch, caplog, code):
    """Lustre without -o flock answers flock() with ENOSYS."""
    def no_flock(fd, operation):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(run_lock.fcntl, "flock", no_flock)
    with run_lock.hold(tmp_path) as locked:
        assert locked is False
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "no flock support" in warnings[0].getMessage()


def test_an_unwritable_run_dir_is_one_line(tmp_path, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(run_lock.os, "open", read_only)
    with pytest.raises(UserError, match=r"resume=.*cannot open .*Read-only file system.*must be writable"):
        with run_lock.hold(tmp_path, "resume"):
            pass


def test_build_run_takes_the_lock_before_reading_or_writing_the_run_dir(tmp_path, holder):
    """The lock in build_run (not only the command-line probe): a second build on a
    locked run directory fails before the resume rewinds or writes anything."""
    from dreamer.run.build import build_run

    cfg = tiny_config()
    cfg.eval.video = False
    build_run(cfg, tmp_path).close()
    (tmp_path / "metrics.jsonl").write_text('{"frames": 10, "updates": 1}\n')  # a record the rewind would cut
    ckpt.save_checkpoint(tmp_path, {"tag": 1}, updates=0, keep=2)
    holder(tmp_path)
    before = _snapshot(tmp_path)
    cfg.resume = str(tmp_path)
    with pytest.raises(run_lock.RunDirInUse):
        build_run(cfg, tmp_path / "elsewhere")
    with pytest.raises(run_lock.RunDirInUse):
        build_run(tiny_config(), tmp_path)
    assert _snapshot(tmp_path) == before


def test_ranks_other_than_0_do_not_lock_and_stop_with_rank_0(tmp_path, holder, monkeypatch):
    """Under torchrun only rank 0 writes: the other ranks never take the lock (they would
    fight rank 0 for it), and learn from rank 0's vote whether it got it."""
    from dreamer.run import build
    from dreamer.system import distributed

    rank1 = distributed.Ranks(rank=1, world_size=2)
    votes = []
    monkeypatch.setattr(distributed, "max_over_ranks", lambda value, group=None: votes.append(value) or 0)
    with build.claimed_run_dir(tiny_config(), tmp_path, rank1, None):
        assert not (tmp_path / run_lock.LOCK_NAME).exists()
    assert votes == [0]
    monkeypatch.setattr(distributed, "max_over_ranks", lambda value, group=None: 1)  # rank 0 failed
    with pytest.raises(UserError, match="rank 0 could not lock"):
        with build.claimed_run_dir(tiny_config(), tmp_path, rank1, None):
            pass
    holder(tmp_path)
    rank0 = distributed.Ranks(rank=0, world_size=2)
    with pytest.raises(run_lock.RunDirInUse):  # rank 0 votes its failure, then raises its own line
        with build.claimed_run_dir(tiny_config(), tmp_path, rank0, None):
            pass


def _last_line(err: str) -> str:
    return [line for line in err.splitlines() if line.strip()][-1]


@pytest.mark.e2e
def test_a_second_writer_is_refused_and_a_killed_holder_leaves_no_stale_lock(tmp_path):
    """Two processes on one run directory: the second (a fresh run with the same
    hydra.run.dir, or a resume) ends with one line naming the first's pid and host,
    exit 2, and changes nothing there. After kill -9 of the first, a resume succeeds."""
    run_dir = tmp_path / "run"
    first = start(*FAST_STATES, f"hydra.run.dir={run_dir}", "train.total_frames=100000",
                  "checkpoint.every=20")
    try:
        wait_for(lambda: has_updates(run_dir)() and ckpt.list_checkpoints(run_dir), 240, "a checkpoint and records")
        os.kill(first.pid, signal.SIGSTOP)  # frozen: the directory changes only if the second writer changes it
        before = _snapshot(run_dir)
        for args in ((f"resume={run_dir}", f"hydra.run.dir={tmp_path / 'h'}"),
                     (*FAST_STATES, f"hydra.run.dir={run_dir}")):
            second = start(*args)
            try:
                _, err = second.communicate(timeout=120)
            finally:
                if second.poll() is None:  # accepted as a second writer: stop it and its workers
                    os.killpg(second.pid, signal.SIGKILL)
                    second.communicate()
            assert second.returncode == 2, err[-2000:]
            last = _last_line(err)
            assert last.startswith("error: ") and f"pid {first.pid} on host {socket.gethostname()}" in last
            assert _snapshot(run_dir) == before
        os.kill(first.pid, signal.SIGCONT)
    finally:
        first.kill()  # kill -9: no clean exit, the lock is the kernel's to drop
        first.communicate(timeout=60)
    frames = ckpt.load_latest(run_dir)["counters"]["frames"]
    resumed = start(f"resume={run_dir}", f"train.total_frames={frames + 100}", "logger.progress_bar=false",
                    f"hydra.run.dir={tmp_path / 'h2'}")
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]
    updates = [r["updates"] for r in read_metrics(run_dir)]
    assert updates == sorted(set(updates))  # the first's records kept, none repeated

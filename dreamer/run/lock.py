"""One writer per run directory: an advisory lock held for the run's whole life.

``<run dir>/run.lock`` is locked with ``flock(LOCK_EX | LOCK_NB)`` on a file
descriptor this process keeps open until the run is torn down. The kernel
drops the lock when the descriptor is closed, including when the process dies
(``kill -9``, OOM killer, node reboot): a lock is never left stale, so the file
itself is never deleted (deleting it would let a second process lock a new
inode while the first still holds the old one). The descriptor is not
inherited by child processes (close-on-exec; workers are spawned, not forked).
The file records the holder's pid, host and start time, for the error a
second writer gets.

What this relies on, by file system:

- Local file systems: ``flock`` is exact.
- NFS: Linux clients emulate ``flock`` with a whole-file POSIX byte-range lock
  (NFSv4 lock state, NLM on v3), so the lock holds across nodes. That is why
  the file is opened read-write: a POSIX write lock needs it. A node that
  crashes holding the lock keeps it until the server's lease expires (NFSv4's
  lease time, 90 s by default); a requeued job that starts on another node within that time is
  told the run is in use and can be started again. A mount with
  ``local_lock=flock`` makes the lock node-local only.
- Lustre: needs the ``flock`` mount option for cluster-wide locks
  (``localflock``: this node only). Without either, ``flock`` fails with
  ENOSYS; that (and EINVAL, EOPNOTSUPP, ENOLCK from other file systems without
  lock support) is one warning line and the run goes on unlocked.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Iterator

from dreamer.errors import UserError

log = logging.getLogger("dreamer")

LOCK_NAME = "run.lock"
# flock errors that mean "this file system cannot lock", not "someone holds it".
NO_LOCK_SUPPORT = (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOLCK)


class RunDirInUse(UserError):
    """Another live process holds the run directory's lock."""


def _describe_holder(text: str) -> str:
    try:
        holder = json.loads(text)
        return f"pid {int(holder['pid'])} on host {holder['host']}, started {holder['started']}"
    except (ValueError, KeyError, TypeError):
        return "its pid and host are not recorded"


def _in_use(run_dir: Path, holder: str, what: str) -> RunDirInUse:
    hint = ("stop it first (it checkpoints on SIGTERM), then resume" if what == "resume"
            else "wait for it to end or stop it, or give this run another hydra.run.dir")
    return RunDirInUse(f"{what}={run_dir} is in use by another run ({holder}): {hint}")


def _read(fd: int) -> str:
    return os.pread(fd, 4096, 0).decode(errors="replace")


@contextlib.contextmanager
def hold(run_dir: Path, what: str = "hydra.run.dir") -> Iterator[bool]:
    """Hold ``run_dir``'s lock for the length of the ``with`` block; yields whether
    it is locked (False: the file system has no lock support, warned once).

    ``what``: the setting that named the directory (``resume`` or ``hydra.run.dir``),
    for the error line. Raises :class:`RunDirInUse` (one line naming the holder's
    pid and host) when another process holds it; nothing in ``run_dir`` is written then.
    """
    run_dir = Path(run_dir)
    path = run_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as err:
        raise UserError(f"{what}={run_dir}: cannot open {path} ({err.strerror or err}); "
                        "the run directory must be writable") from None
    try:
        locked = _lock(fd, run_dir, what)
        if locked:
            holder = {"pid": os.getpid(), "host": socket.gethostname(),
                      "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        yield locked
    finally:
        os.close(fd)  # releases the lock


def _lock(fd: int, run_dir: Path, what: str) -> bool:
    """Lock ``fd`` exclusively without waiting; False where the file system cannot lock."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _in_use(run_dir, _describe_holder(_read(fd)), what) from None
    except OSError as err:
        if err.errno not in NO_LOCK_SUPPORT:
            raise
        log.warning("cannot lock %s (%s: this file system has no flock support, e.g. Lustre mounted without "
                    "-o flock): make sure no other run writes to %s", run_dir / LOCK_NAME, err.strerror, run_dir)
        return False
    return True


def refuse_if_held(run_dir: Path, what: str = "hydra.run.dir") -> None:
    """Fail in one line when a live process holds ``run_dir``'s lock; creates and
    writes nothing (a probe before Hydra writes its own files into the directory).
    The lock itself is taken later, by :func:`hold`."""
    path = Path(run_dir) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # no lock file (no run yet), or unreadable: hold() decides
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _in_use(Path(run_dir), _describe_holder(_read(fd)), what) from None
    except OSError:  # no lock support: hold() warns
        pass
    finally:
        os.close(fd)

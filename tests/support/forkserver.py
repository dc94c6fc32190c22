"""`python -m dreamer` forked from a process that has imported torch, tensordict and torchrl.

Every run an e2e test starts would otherwise spend its first CPU-seconds importing the
same libraries (torch, tensordict with torch._dynamo, torchrl: a large share of a short
run, docs/PERFORMANCE.md), then matplotlib for its learning curve and our own run modules. A
server process per pytest process imports them once (``PRELOAD``), with the environment the
runs get, and forks a child per run. The child is a run as ``python -m dreamer``
starts it from there on: a new session if asked, the caller's pipes as its stdio, its
environment, ``runpy`` running ``dreamer`` as ``__main__``, and the interpreter's exit
(non-daemon threads joined, atexit handlers, exit status or death by signal).

What a fork cannot show is what happens while those libraries import (warnings printed
then, environment read then): tests about a run's console start a fresh interpreter
(``fresh=True`` in tests/support/processes.py), as does any run whose environment differs
from the server's in what those imports read (``ForkServer.serves``).

Why it stays: it is the simplest way found to hold the suite's time (its run-starting tests
took about half the wall time forked, docs/PERFORMANCE.md, where shorter runs and fewer
processes had already been taken). To run a test without it, as a user's shell would start
each run: ``DREAMER_TESTS_EXEC=1 python -m pytest tests/e2e/test_train.py``.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# Environment variables the preloaded libraries do not read at import: runs that differ in them are forked.
RUN_TIME_VARIABLES = ("PYTEST_CURRENT_TEST", "HOME")
RUN_TIME_PREFIXES = ("WANDB_", "PROF_")
PRELOAD = ("torch", "tensordict", "torchrl", "torchrl.collectors", "torchrl.data", "torchrl.envs", "torchrl.modules",
           "torchrl.objectives", "hydra", "omegaconf",
           # Ours: importing them only defines things (none reads the environment) and the
           # server runs nothing, so every forked run finds them as a fresh run would.
           "dreamer.run.trainer", "dreamer.run.build")


# -- the server (its own process) --------------------------------------------------------------------------

def _serve(path: str) -> None:
    from dreamer.report.console import quiet_libraries

    quiet_libraries(os.environ)  # what `python -m dreamer` does before it imports anything heavy
    for name in PRELOAD:
        __import__(name)
    import matplotlib

    matplotlib.use("Agg")  # as dreamer.report.plots selects it
    import matplotlib.pyplot  # noqa: F401  every run draws its learning curve at its end
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # The socket appears at ``path`` only once it listens (the client waits for the path, and
    # a connect between bind and listen is refused): bound under another name, then renamed.
    listener.bind(path + ".binding")
    listener.listen(16)
    os.rename(path + ".binding", path)
    listener.settimeout(0.1)
    clients: dict[int, socket.socket] = {}
    while os.getppid() == parent:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            conn = None
        if conn is not None:
            conn.settimeout(None)
            message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            request = json.loads(message.decode())
            sys.stdout.flush(), sys.stderr.flush()
            ready_r, ready_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                listener.close()
                for other in clients.values():
                    other.close()
                conn.close()
                os.close(ready_r)
                _become_run(request, fds, ready_w)  # never returns
            for fd in (*fds, ready_w):
                os.close(fd)
            os.read(ready_r, 1)  # its session and stdio are in place, as when Popen returns
            os.close(ready_r)
            conn.sendall(f"{pid}\n".encode())
            clients[pid] = conn
        while clients:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = clients.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                except OSError:
                    pass
                conn.close()


def _become_run(request: dict, fds: list[int], ready: int) -> None:
    """In the forked child: become `python -m dreamer ARGS` and exit as its interpreter would;
    ``ready`` is written once its session, stdio, directory and environment are set."""
    code = 1
    try:
        if request["new_session"]:
            os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.chdir(request["cwd"])
        if sys.path and sys.path[0] == "":
            sys.path[0] = os.getcwd()  # as `python -m` puts it
        os.environ.clear()
        os.environ.update(request["env"])
        os.write(ready, b"1")
        os.close(ready)
        import random

        random.seed()  # a fresh interpreter's seed, not the server's state
        sys.argv = ["dreamer", *request["args"]]
        import runpy

        try:
            runpy._run_module_as_main("dreamer")  # what `python -m dreamer` calls
            code = 0
        except SystemExit as stop:
            code = _exit_code(stop.code)
        except KeyboardInterrupt:
            _finish()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)  # dies by it, as the interpreter does on an uncaught Ctrl-C
        except BaseException:
            sys.excepthook(*sys.exc_info())
            code = 1
        _finish()
    finally:
        os._exit(code)


def _exit_code(value) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)
    return 1


def _finish() -> None:
    """The interpreter's shutdown: non-daemon threads joined, atexit handlers run, stdio flushed."""
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


# -- the client (the test's process) -----------------------------------------------------------------------

class ForkedRun:
    """The Popen calls the e2e tests make, for a run the server forked (not our child:
    its exit status comes over the server's connection)."""

    def __init__(self, args: list[str], conn: socket.socket, stdout, stderr):
        self.args, self._conn, self.stdout, self.stderr = args, conn, stdout, stderr
        self._buffer = b""
        self.pid = int(self._line(None))
        self.returncode: int | None = None

    def _line(self, timeout: float | None) -> str:
        """The server's next line (the pid, then the exit status); '' if it closed the connection."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([self._conn], [], [], left)
            if not ready:
                continue
            data = self._conn.recv(64)
            if not data:
                return ""
            self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self._status(0)
            except TimeoutError:
                pass
        return self.returncode

    def _status(self, timeout: float | None) -> None:
        line = self._line(timeout)
        self.returncode = int(line) if line else -signal.SIGKILL  # the server died with it
        self._conn.close()

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                self._status(timeout)
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
        return self.returncode

    def communicate(self, input=None, timeout: float | None = None) -> tuple[str | None, str | None]:
        """Both pipes read to their end (by threads, as subprocess does where it cannot
        select), then the exit status; TimeoutExpired if either takes past ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        results: dict = {}

        def read(name: str, stream) -> None:
            results[name] = stream.read()
            stream.close()

        readers = [threading.Thread(target=read, args=(name, stream), daemon=True)
                   for name, stream in (("out", self.stdout), ("err", self.stderr))
                   if stream is not None and not stream.closed]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return results.get("out"), results.get("err")

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """One server per test process, started at its first run and ended with the process."""

    def __init__(self, env: dict, cwd: Path):
        self.env, self.cwd = dict(env), str(cwd)
        self._dir = tempfile.mkdtemp(prefix="dreamer-forkserver-")
        self.path = os.path.join(self._dir, "socket")
        self.process = subprocess.Popen(
            [sys.executable, "-c", f"from tests.support.forkserver import _serve; _serve({self.path!r})"],
            cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        atexit.register(self.close)

    def serves(self, env: dict, cwd: Path) -> bool:
        """Whether a run with ``env`` in ``cwd`` may be forked from here: the libraries were
        imported with the same environment, but for what none of them reads while importing
        (the run gets its own environment): pytest's name of the current test, HOME (only
        matplotlib reads it then, to find its font cache), W&B's variables (read when a run
        starts W&B; an in-process W&B test leaves some behind) and our profiler's (read when
        a run starts)."""
        def imported_with(e: dict) -> dict:
            return {k: v for k, v in e.items() if k not in RUN_TIME_VARIABLES and not k.startswith(RUN_TIME_PREFIXES)}

        return self.process.poll() is None and imported_with(env) == imported_with(self.env) and str(cwd) == self.cwd

    def start(self, args: list[str], env: dict, *, new_session: bool) -> ForkedRun:
        deadline = time.monotonic() + 300  # the server is still importing its libraries
        while not os.path.exists(self.path):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the fork server did not start (exit {self.process.returncode})")
            time.sleep(0.05)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.path)
            request = {"args": args, "env": env, "cwd": self.cwd, "new_session": new_session}
            socket.send_fds(conn, [json.dumps(request).encode()], [null, out_w, err_w])
        finally:
            for fd in (null, out_w, err_w):
                os.close(fd)
        return ForkedRun([sys.executable, "-m", "dreamer", *args], conn, os.fdopen(out_r, "r"),
                         os.fdopen(err_r, "r"))  # text, as Popen(text=True)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self._dir, ignore_errors=True)  # the socket (or one still binding)

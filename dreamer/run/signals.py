"""Stop requests: SIGTERM / SIGINT / SIGUSR1 finish the run cleanly; a second SIGINT exits now.

A handler only sets a flag; the train loop checks it between batches and
updates, stops the collectors, writes a final checkpoint and exits 0. Nothing
is interrupted mid-write. Collector workers ignore SIGINT/SIGTERM (a Ctrl-C
reaches the whole process group): the main process shuts them down itself,
and they exit on their own when its pipe closes (the main process was killed).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import psutil

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
FORCED_EXIT_CODE = 130  # 128 + SIGINT, what a shell reports for Ctrl-C


class StopRequest:
    """Installed for the length of a run; ``requested`` names the signal that asked to stop."""

    def __init__(self):
        self.requested: str | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None and signum == signal.SIGINT:
            print("error: second SIGINT: exiting now without a final checkpoint", file=sys.stderr)
            kill_children()
            os._exit(FORCED_EXIT_CODE)
        if self.requested is None:
            self.requested = name
            print(f"{name}: stopping after this step; writing a final checkpoint "
                  "(SIGINT again exits at once)", file=sys.stderr, flush=True)

    def install(self) -> "StopRequest":
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def kill_children() -> None:
    """SIGKILL every process this one started (collector workers and their helpers)."""
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            child.kill()


def ignore_stop_signals() -> None:
    """Collector worker start-up hook: the main process owns the workers' lifetime
    (a Ctrl-C or a SLURM SIGTERM reaches the whole process group)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)

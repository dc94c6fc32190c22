"""Stop requests from the scheduler: a signal sets a flag; the train loop checks
``requested()`` at a safe point (between updates), writes a checkpoint and
returns early. What happens next (exit, or requeue through submitit) is up to
whoever installed the handlers.

A signal is process-wide, so this state is too: one flag per process.
"""

from __future__ import annotations

import signal
from typing import Iterable

# Slurm sends SIGUSR1/2 (--signal=...@seconds) before the time limit and
# SIGTERM on preemption or scancel.
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)

_requested_by: int | None = None
_previous: dict[int, object] = {}
_installed = False


def installed() -> bool:
    """True inside a requeueing job (a launcher or a SLURM batch job installed the
    handlers): a stop then means checkpoint and requeue, not finish."""
    return _installed


def requested() -> bool:
    """True once a stop signal arrived: checkpoint and stop at the next safe point."""
    return _requested_by is not None


def requested_by() -> int | None:
    return _requested_by


def request(signum: int, frame=None) -> None:
    """The signal handler; also callable directly (tests, other stop sources)."""
    global _requested_by
    _requested_by = signum


def install(signals: Iterable[int] = STOP_SIGNALS) -> None:
    """Route ``signals`` to :func:`request`, remembering the handlers they replace
    (installing twice keeps the first ones: those are what uninstall restores)."""
    global _requested_by, _installed
    _requested_by = None
    _installed = True
    for signum in signals:
        previous = signal.signal(signum, request)
        if previous is not request:
            _previous[signum] = previous


def uninstall() -> None:
    """Put back the handlers :func:`install` replaced."""
    global _installed
    _installed = False
    for signum, handler in _previous.items():
        signal.signal(signum, handler)
    _previous.clear()

"""Why a run stops early, in one object: stop signals, the wall-clock budget, the rank vote.

SIGTERM (preemption, scancel), SIGINT (Ctrl-C) and SIGUSR1/SIGUSR2 (SLURM's
``--signal=...@seconds`` before the time limit) ask the run to stop; a second
SIGINT exits at once. A handler only records the first signal's name; the
train loop asks :meth:`Stopper.poll` at safe points (before every update and
after every batch), so nothing is interrupted mid-write.

What a stop by signal means depends on who runs us. Under a requeueing
scheduler (a SLURM batch job, or hydra_plugins/dreamer_launcher) the run is
not finished: it checkpoints and returns ``finished_by="preempted"`` (no final
eval, no summary) and the requeued job resumes it. Otherwise it finishes
early: final checkpoint, summary (``stopped_by``), exit 0.

Collector workers ignore the stop signals (a Ctrl-C or a SLURM signal reaches
the whole process group): the main process shuts them down itself, and they
exit on their own when its pipe closes (the main process was killed).
"""

from __future__ import annotations

import contextlib
import enum
import os
import signal
import sys
import time
from typing import Callable, Mapping

import psutil

from dreamer.run.cadence import Every
from dreamer.run.result import FinishedBy

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
FORCED_EXIT_CODE = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
# Set by the requeueing launcher in its job process (read once, at the entry point).
REQUEUE_ENV = "DREAMER_REQUEUE"

# Why the loop ends early, in rising priority: the ranks vote with the index
# (max over ranks) and all leave for the strongest reason any of them has.
class StopReason(str, enum.Enum):
    """Why the loop stops before its frames are done."""

    MAX_MINUTES = "max_minutes"  # train.max_minutes
    SIGNAL = "signal"  # a stop signal, here or on another rank


# Vote values: ranks agree on the most urgent reason (its index here).
REASONS = (None, StopReason.MAX_MINUTES, StopReason.SIGNAL)
# Ranks vote before every RANK_VOTE_EVERY-th update (and at every collector
# batch), not before each one: a vote is a blocking collective. A stop then
# waits at most this many updates, seconds against a scheduler's warning.
RANK_VOTE_EVERY = 10


# A stop signal that lands in a finalizer interrupts the work after this much more CPU time
# (Stopper._interrupt).
RETRY_INTERRUPT_S = 0.05


def _in_finalizer(frame) -> bool:
    """Whether ``frame`` runs inside a ``__del__`` (anywhere up its stack)."""
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def under_requeueing_scheduler(environ: Mapping[str, str]) -> bool:
    """A SLURM job, or the requeueing launcher: a stop then means checkpoint and requeue."""
    return "SLURM_JOB_ID" in environ or environ.get(REQUEUE_ENV) == "1"


class StopRequested(BaseException):
    """A stop signal inside :meth:`Stopper.interruptible`: the work in progress is abandoned.
    A BaseException, as KeyboardInterrupt is: library code that catches Exception (a
    compiler falling back on an error) must not swallow it."""


class Stopper:
    """Installed for the length of a run (:meth:`install`, :meth:`uninstall`).

    ``requested``: the name of the first stop signal (later ones keep it).
    ``deadline``: a ``clock()`` time (train.max_minutes) or None.
    ``vote``: reduces a reason's index over the ranks (max), or None for one process.
    """

    def __init__(self, *, requeue: bool = False, clock: Callable[[], float] = time.perf_counter):
        self.requeue = requeue
        self.requested: str | None = None
        self.deadline: float | None = None
        self.vote: Callable[[int], int] | None = None
        self._vote_due = Every(RANK_VOTE_EVERY)
        self._clock = clock
        self._previous: dict[int, object] = {}
        self._interruptible = False

    # -- signals --------------------------------------------------------------
    def install(self) -> "Stopper":
        """Route the stop signals here, remembering the handlers they replace
        (installing twice keeps the first ones: those are what uninstall restores)."""
        for sig in STOP_SIGNALS:
            previous = signal.signal(sig, self._handle)
            self._previous.setdefault(sig, previous)
        return self

    def uninstall(self) -> None:
        """Put back the handlers :meth:`install` replaced (a no-op the second time)."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if self.requested is not None and signum == signal.SIGINT:
            print("error: second SIGINT: exiting now without a final checkpoint", file=sys.stderr)
            kill_children()
            os._exit(FORCED_EXIT_CODE)
        self.request(signal.Signals(signum).name)
        self._interrupt(frame)

    def _interrupt(self, frame) -> None:
        """Raise StopRequested in ``frame`` (where the main thread was) inside interruptible().
        Not inside a finalizer (a ``__del__`` the garbage collector runs in the middle of any
        work): Python ignores what one raises, so the stop would be lost; the raise is tried
        again after a moment of the process's CPU time (SIGVTALRM: SIGALRM's real-time timer
        may be someone else's, pytest-timeout's say), wherever the work has moved on to."""
        if not self._interruptible:
            return
        if _in_finalizer(frame):
            signal.setitimer(signal.ITIMER_VIRTUAL, RETRY_INTERRUPT_S)
            return
        self._interruptible = False  # raised once: the caller's cleanup runs uninterrupted
        raise StopRequested(self.requested)

    @contextlib.contextmanager
    def interruptible(self):
        """Inside, a stop signal also raises :class:`StopRequested` in the main thread at once,
        for long work with no safe point to poll at whose result may be thrown away (the
        foreground compile warm-up). With ranks it does nothing: every rank must leave at
        the same, voted, update."""
        if self.vote is not None:
            yield
            return
        previous_alarm = signal.signal(signal.SIGVTALRM, lambda signum, frame: self._interrupt(frame))
        self._interruptible = True
        try:
            if self.requested is not None:  # asked before: set first, so no signal slips between
                raise StopRequested(self.requested)
            yield
        finally:
            self._interruptible = False
            signal.setitimer(signal.ITIMER_VIRTUAL, 0)
            signal.signal(signal.SIGVTALRM, previous_alarm)

    def request(self, name: str) -> None:
        """Ask to stop (what a signal does; also callable directly)."""
        if self.requested is None:
            self.requested = name
            print(f"{name}: stopping after this step; writing a final checkpoint "
                  "(SIGINT again exits at once)", file=sys.stderr, flush=True)

    # -- budget and vote ------------------------------------------------------
    def limit_time(self, started: float, minutes: float | None) -> None:
        """train.max_minutes, counted from ``started`` (a ``clock()`` time)."""
        self.deadline = None if minutes is None else started + 60.0 * minutes

    def local_reason(self) -> StopReason | None:
        if self.requested is not None:
            return StopReason.SIGNAL
        if self.deadline is not None and self._clock() >= self.deadline:
            return StopReason.MAX_MINUTES
        return None

    def poll(self, before_update: int | None = None) -> StopReason | None:
        """Why the loop must end now, the same on every rank (they leave together):
        a stop signal (here or on any rank), the wall-clock budget, or None.

        ``before_update``: the number of the update about to be made. With ranks,
        only every RANK_VOTE_EVERY-th one is a vote; between votes a local reason
        waits (a rank leaving alone would hang the others' gradient all-reduce)."""
        reason = self.local_reason()
        if self.vote is None:
            return reason
        if before_update is not None and not self._vote_due(before_update):
            return None
        return REASONS[self.vote(REASONS.index(reason))]

    def finished_by(self, reason: StopReason | None) -> FinishedBy:
        """The run's outcome for the loop's exit ``reason`` (None: it ran its frames)."""
        if reason is None:
            return FinishedBy.TOTAL_FRAMES
        reason = StopReason(reason)
        if reason is StopReason.SIGNAL and self.requeue:
            return FinishedBy.PREEMPTED  # a requeueing scheduler continues the run
        return FinishedBy(reason.value)

    @property
    def why(self) -> str:
        """For log lines: the signal, or that another rank had one."""
        return self.requested or "rank signal"


def kill_children() -> None:
    """SIGKILL every process this one started (collector workers and their helpers)."""
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            child.kill()


def ignore_stop_signals() -> None:
    """Collector worker start-up hook: the main process owns the workers' lifetime
    (a Ctrl-C or a SLURM signal reaches the whole process group)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)

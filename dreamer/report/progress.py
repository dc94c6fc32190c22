"""The run's progress bar, and its estimate of the time left.

tqdm's own ETA divides the frames left by the frame rate so far: fooled by the
random phase (thousands of frames a second before learning starts), blind to a
blocking compile warm-up and to evaluations. Ours counts what the rest of the
run will do: the updates left at the recent pace of the loop (collection,
weight pushes, logging and checkpoints included, evaluation excluded) plus the
evaluations left at their measured cost, the final one included. Before the
first updates there is nothing to measure: the bar says so instead of guessing.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Callable

import tqdm

# Pace over the last this many seconds of learning (evaluation excluded): long
# enough to smooth per-update noise, short enough to follow a switch to
# compiled losses within a minute or two.
PACE_WINDOW_S = 90.0


def seconds_left(*, frames: int, total_frames: int, frames_per_update: float, updates: int,
                 seconds_per_update: float, eval_every: int, seconds_per_eval: float) -> float:
    """Wall seconds until ``total_frames``: the updates still owed at ``seconds_per_update``
    each, plus every evaluation due on the way and the final one at ``seconds_per_eval``."""
    updates_left = max(0, math.ceil((total_frames - frames) / frames_per_update))
    evals_left = (updates + updates_left) // eval_every - updates // eval_every + 1  # + the final eval
    return updates_left * seconds_per_update + evals_left * seconds_per_eval


class Progress:
    """Frames done of ``total_frames``, updates, the last eval return, updates/s and an
    honest ETA (:func:`seconds_left`). The trainer reports to it; ``clock`` is for tests."""

    def __init__(self, *, total_frames: int, frames: int, frames_per_update: float, eval_every: int,
                 enabled: bool = True, clock: Callable[[], float] = time.perf_counter):
        self.total_frames, self.frames = total_frames, frames
        self.frames_per_update, self.eval_every = frames_per_update, eval_every
        self.clock = clock
        self.eval_seconds: list[float] = []
        self.eval_return: float | None = None
        self.updates = 0
        self.pace: deque[tuple[float, int]] = deque()  # (learning clock, updates), evaluations excluded
        self.evaluating_s = 0.0  # evaluation time so far, taken off the learning clock
        self.bar = tqdm.tqdm(
            total=total_frames, initial=frames, unit="frame", disable=not enabled, dynamic_ncols=True,
            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} frames [{elapsed}{postfix}]",
        )
        self.bar.set_postfix_str("filling the replay buffer", refresh=False)

    def phase(self, text: str) -> None:
        """What the run does before its first update (shown at once)."""
        self.bar.set_postfix_str(text)

    def collected(self, frames: int) -> None:
        self.frames += frames
        self.bar.update(frames)

    def learned(self, updates: int) -> None:
        """Called after each batch of updates: the pace sample, the bar's text."""
        self.updates = updates
        now = self.clock() - self.evaluating_s
        self.pace.append((now, updates))
        while len(self.pace) > 2 and now - self.pace[1][0] >= PACE_WINDOW_S:
            self.pace.popleft()
        self._show()

    def evaluated(self, seconds: float, mean_return: float) -> None:
        self.eval_seconds.append(seconds)
        self.evaluating_s += seconds
        self.eval_return = mean_return

    def seconds_per_update(self) -> float | None:
        if len(self.pace) < 2 or self.pace[-1][1] == self.pace[0][1]:
            return None
        (t0, u0), (t1, u1) = self.pace[0], self.pace[-1]
        return (t1 - t0) / (u1 - u0)

    def eta_s(self) -> float | None:
        """Seconds left, None until the pace of learning is measured. Before the first
        evaluation its cost is not known and counts as 0."""
        pace = self.seconds_per_update()
        if pace is None:
            return None
        per_eval = sum(self.eval_seconds) / len(self.eval_seconds) if self.eval_seconds else 0.0
        return seconds_left(frames=self.frames, total_frames=self.total_frames,
                            frames_per_update=self.frames_per_update, updates=self.updates,
                            seconds_per_update=pace, eval_every=self.eval_every, seconds_per_eval=per_eval)

    def _show(self) -> None:
        eta, pace = self.eta_s(), self.seconds_per_update()
        parts = [f"ETA {tqdm.tqdm.format_interval(eta) if eta is not None else '?'}", f"updates={self.updates}"]
        if pace:
            parts.append(f"{1 / pace:.1f} updates/s")
        if self.eval_return is not None:
            parts.append(f"eval={self.eval_return:.1f}")
        self.bar.set_postfix_str(", ".join(parts), refresh=False)

    def close(self) -> None:
        self.bar.close()

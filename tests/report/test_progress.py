"""dreamer/report/progress.py: the progress bar's time left is what the rest of the run really takes."""

from __future__ import annotations

import pytest

from dreamer.report.progress import Progress, seconds_left


def test_time_left_counts_the_updates_and_every_evaluation_still_due():
    # 1,000 frames left at 4 frames an update: 250 updates; from update 500 to 750 the
    # evaluations at 600 and 700 are due, and the final one.
    left = seconds_left(frames=3000, total_frames=4000, frames_per_update=4, updates=500,
                        seconds_per_update=0.1, eval_every=100, seconds_per_eval=5.0)
    assert left == pytest.approx(250 * 0.1 + 3 * 5.0)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _simulate(progress, clock, *, updates, update_s, eval_every, eval_s, frames_per_update, check_at, first=1):
    """A run's loop as the trainer reports it; returns the ETA shown at update ``check_at``
    and the seconds the rest of the run then really took."""
    eta = shown_at = None
    for u in range(first, first + updates):
        clock.now += update_s
        progress.collected(frames_per_update)
        if u % eval_every == 0:
            clock.now += eval_s
            progress.evaluated(eval_s, -1000.0)
        progress.learned(u)
        if u == check_at:
            eta, shown_at = progress.eta_s(), clock.now
    clock.now += eval_s  # the final evaluation
    return eta, clock.now - shown_at


def test_the_eta_shown_early_is_the_time_the_run_then_takes():
    # 4,000 random frames at once, then 3,000 updates of 0.1 s (4 frames each) with a
    # 6 s evaluation every 250 updates and at the end: 5 minutes of updates, 78 s of evals.
    clock = FakeClock()
    progress = Progress(total_frames=16000, frames=0, frames_per_update=4, eval_every=250, enabled=False,
                        clock=clock)
    progress.collected(4000)  # the random phase: thousands of frames a second
    clock.now += 1.0
    assert progress.eta_s() is None  # nothing learned yet: no guess (tqdm's said "00:02" here)
    eta, really = _simulate(progress, clock, updates=3000, update_s=0.1, eval_every=250, eval_s=6.0,
                            frames_per_update=4, check_at=300)
    assert eta == pytest.approx(really, rel=0.02)


def test_the_pace_follows_a_faster_learner_within_its_window():
    # Compiled losses arrive at update 500 and halve the update time: the ETA follows
    # the new pace once the window holds only compiled updates.
    clock = FakeClock()
    progress = Progress(total_frames=10000, frames=0, frames_per_update=4, eval_every=10**6, enabled=False,
                        clock=clock)
    _simulate(progress, clock, updates=500, update_s=0.2, eval_every=10**6, eval_s=0.0,
              frames_per_update=4, check_at=500)
    eta, really = _simulate(progress, clock, updates=2000, update_s=0.1, eval_every=10**6, eval_s=0.0,
                            frames_per_update=4, check_at=1500, first=501)
    assert progress.seconds_per_update() == pytest.approx(0.1)
    assert eta == pytest.approx(really, rel=0.01)

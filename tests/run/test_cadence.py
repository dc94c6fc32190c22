"""dreamer/run/cadence.py: Every fires once per period crossed; Ratio carries fractions."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest

from dreamer.run.cadence import Every, Ratio


def _fires(every: Every, counters) -> list[int]:
    return [c for c in counters if every(c)]


@pytest.mark.parametrize("period", [1, 3, 10])
def test_every_fires_at_each_multiple_when_counting_up(period):
    counters = range(1, 4 * period + 2)
    assert _fires(Every(period), counters) == [c for c in counters if c % period == 0]


def test_every_does_not_fire_at_zero():
    assert not Every(5)(0)


def test_every_fires_once_when_a_jump_crosses_several_periods():
    every = Every(10)
    assert _fires(every, [3, 9, 35, 36, 39, 40, 41]) == [35, 40]


def test_every_does_not_fire_twice_for_the_same_counter():
    every = Every(4)
    assert every(8)
    assert not every(8)
    assert not every(11)
    assert every(12)


def test_every_starting_point():
    every = Every(10, last=15)  # fired at 15 (e.g. restored): next is the next multiple
    assert _fires(every, [16, 19, 20, 25, 30]) == [20, 30]


def test_every_state_dict_round_trip_resumes_the_schedule():
    original = Every(7)
    _fires(original, range(1, 17))  # fired at 7 and 14
    restored = Every(7)
    restored.load_state_dict(original.state_dict())
    later = list(range(17, 40))
    assert _fires(restored, later) == _fires(original, later) == [21, 28, 35]


def test_ratio_docstring_example_carries_the_half():
    ratio = Ratio(0.25)
    assert ratio.owed(10) == 2
    assert ratio.owed(2) == 1


@pytest.mark.parametrize("rate", [1.0, 2.5, 0.125, 0.5, 3.0])
def test_ratio_total_is_exact_for_exactly_representable_rates(rate):
    rng = random.Random(0)
    ratio, total, steps = Ratio(rate), 0, 0
    for _ in range(500):
        n = rng.randint(0, 40)
        steps += n
        total += ratio.owed(n)
        assert total == math.floor(Fraction(rate) * steps)


@pytest.mark.parametrize("rate", [0.1, 1 / 3, 100 / 800, 40 / 40, 100 / (16 * 50), 0.0375])
def test_ratio_never_drifts_from_the_exact_total(rate):
    rng = random.Random(1)
    intended = Fraction(rate).limit_denominator(10**6)  # 0.1 -> 1/10, 1/3 -> 1/3
    ratio, total, steps = Ratio(rate), 0, 0
    for _ in range(2000):
        n = rng.randint(1, 100)
        steps += n
        owed = ratio.owed(n)
        assert owed >= 0
        total += owed
        exact = intended * steps
        # Whole updates are paid out as soon as they are earned (never early);
        # only float rounding may delay one by a step.
        assert exact - 1 <= total <= exact + Fraction(1, 10**9), (steps, total, exact)


def test_ratio_below_one_pays_out_an_update_every_1_over_rate_steps():
    ratio = Ratio(0.25)
    owed = [ratio.owed(1) for _ in range(12)]
    assert owed == [0, 0, 0, 1] * 3


def test_ratio_zero_steps_owes_nothing():
    ratio = Ratio(0.5)
    assert ratio.owed(0) == 0
    assert ratio.owed(1) == 0
    assert ratio.owed(0) == 0
    assert ratio.owed(1) == 1


def test_ratio_state_dict_round_trip_keeps_the_carried_fraction():
    original = Ratio(0.3)
    original.owed(7)  # 2 paid, 0.1 carried
    restored = Ratio(0.3)
    restored.load_state_dict(original.state_dict())
    assert restored.credit == pytest.approx(original.credit)
    assert [restored.owed(3) for _ in range(5)] == [original.owed(3) for _ in range(5)]


def test_ratio_refund_keeps_updates_a_stopped_batch_did_not_make():
    """A run stopped after 1 of 3 owed updates, resumed: the total matches an unstopped run."""
    stopped, reference = Ratio(0.5), Ratio(0.5)
    owed = stopped.owed(6)
    stopped.refund(owed - 1)  # made only one of them
    resumed = Ratio(0.5)
    resumed.load_state_dict(stopped.state_dict())
    assert 1 + resumed.owed(4) == reference.owed(6) + reference.owed(4)

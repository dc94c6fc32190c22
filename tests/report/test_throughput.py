"""dreamer/report/throughput.py: rates count from learning's start, leave evaluation time out,
and the interval rates restart at every record."""

from __future__ import annotations

import pytest

from dreamer.report import throughput


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(throughput.time, "perf_counter", lambda: now[0])
    return now


def test_rates_before_learning_starts_are_zero_and_no_interval_is_reported(clock):
    meter = throughput.Throughput()
    assert meter.overall(updates=5, frames=500, eval_s=0.0) == {"updates_per_s": 0.0, "frames_per_s": 0.0}
    assert meter.interval(updates=5, frames=500, eval_s=0.0) == {}


def test_evaluation_seconds_are_left_out_of_the_rates(clock):
    meter = throughput.Throughput()
    meter.begin(updates=10, frames=1000)  # a resumed run: counters do not start at zero
    clock[0] += 30.0  # 10 s of it evaluating
    rates = meter.overall(updates=50, frames=3000, eval_s=10.0)
    assert rates == {"updates_per_s": pytest.approx(2.0), "frames_per_s": pytest.approx(100.0)}


def test_interval_rates_count_from_the_previous_record(clock):
    meter = throughput.Throughput()
    meter.begin(updates=0, frames=0)
    clock[0] += 10.0
    assert meter.interval(updates=100, frames=1000, eval_s=0.0)["updates_per_s_interval"] == pytest.approx(10.0)
    clock[0] += 10.0  # slower now, 5 s of it evaluating
    second = meter.interval(updates=110, frames=1100, eval_s=5.0)
    assert second == {"updates_per_s_interval": pytest.approx(2.0), "frames_per_s_interval": pytest.approx(20.0)}
    # the overall rate still counts from learning's start
    assert meter.overall(updates=110, frames=1100, eval_s=5.0)["updates_per_s"] == pytest.approx(110 / 15)

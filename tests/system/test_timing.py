"""dreamer/system/timing.py: device work is timed once the device has finished it."""

from __future__ import annotations

import time

import pytest
import torch

from dreamer.system.timing import device_clock
from tests.support.gpu_checks import DEVICE_CLOCK

pytestmark = pytest.mark.gpu_acceptance(DEVICE_CLOCK)


def test_the_clock_waits_for_cuda_work_and_not_for_cpu(monkeypatch):
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(device))
    device_clock(torch.device("cpu"))
    assert waited == []
    before = device_clock(torch.device("cuda", 1))
    assert waited == [torch.device("cuda", 1)]
    assert device_clock(torch.device("cuda", 1)) >= before



def test_the_run_clock_starts_when_the_process_did():
    import psutil

    from dreamer.system.timing import process_start

    age = time.time() - psutil.Process().create_time()  # pytest's imports and collection at least
    counted = time.perf_counter() - process_start()
    assert age > 0.5 and counted >= age - 0.5

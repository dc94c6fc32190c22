"""dreamer/system/timing.py: device work is timed once the device has finished it."""

from __future__ import annotations

import torch

from dreamer.system.timing import device_clock


def test_the_clock_waits_for_cuda_work_and_not_for_cpu(monkeypatch):
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(device))
    device_clock(torch.device("cpu"))
    assert waited == []
    before = device_clock(torch.device("cuda", 1))
    assert waited == [torch.device("cuda", 1)]
    assert device_clock(torch.device("cuda", 1)) >= before


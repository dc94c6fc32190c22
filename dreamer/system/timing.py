"""Wall-clock timing of device work.

CUDA runs asynchronously: a host clock read right after a launch measures the
launch, not the work. Timing a stretch of device work (warm-up, benchmarks)
reads the clock only once the device has finished what was queued.
"""

from __future__ import annotations

import time

import torch


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (no-op off CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_clock(device: torch.device) -> float:
    """``time.perf_counter()`` once ``device`` has finished its queued work."""
    synchronize(device)
    return time.perf_counter()


def process_start() -> float:
    """When this process started, on the ``time.perf_counter()`` clock: budgets and
    ``wall_s`` count the interpreter's imports and Hydra's start-up too, as a user's
    stopwatch does. Falls back to now where the start time cannot be read."""
    try:
        import psutil

        age = time.time() - psutil.Process().create_time()
    except Exception:  # no /proc: count from here
        age = 0.0
    return time.perf_counter() - max(0.0, age)

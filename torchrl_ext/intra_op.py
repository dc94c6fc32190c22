"""One intra-op thread for a helper thread, leaving the process's count alone.

Every thread that runs a parallel ATen op leads an OpenMP team of its own. A
replay buffer's prefetch threads do once the storage holds more than ATen's
grain of 32,768 steps (the slice sampler scans every stored step per sample),
and with more OpenMP threads than cores libgomp stops letting idle workers spin:
from then on the learner's own team sleeps and wakes between ops, and the
process runs well below its cores.
``torch.set_num_threads`` cannot confine it: it is process-wide, and would drop
the learner's count too. The OpenMP runtime's own setting is per thread.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import os

import torch


@functools.cache
def _openmp_runtime() -> ctypes.CDLL | None:
    """The OpenMP runtime torch runs on: the one its wheel ships, else the system's."""
    shipped = os.path.join(os.path.dirname(torch.__file__), "lib")
    candidates = [p for pattern in ("libgomp*.so*", "libiomp5*", "libomp*")
                  for p in sorted(glob.glob(os.path.join(shipped, pattern)))]
    candidates += [p for p in (ctypes.util.find_library(n) for n in ("gomp", "iomp5", "omp")) if p]
    for path in candidates:
        try:
            runtime = ctypes.CDLL(path)
        except OSError:
            continue
        if hasattr(runtime, "omp_set_num_threads"):
            return runtime
    return None


def use_one_intra_op_thread() -> bool:
    """The calling thread's ATen ops run on it alone; other threads keep their count.
    False where torch's OpenMP runtime is not found (the thread then keeps the
    process's count, as before)."""
    runtime = _openmp_runtime()
    if runtime is None:
        return False
    # ATen sets each thread's count from the process's on the thread's first
    # parallel op; done first here, so that it does not overwrite this one.
    torch.get_num_threads()
    runtime.omp_set_num_threads(1)
    return True

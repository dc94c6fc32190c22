"""dreamer/system/memory.py: the learner process keeps freed host memory for reuse."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import textwrap

import pytest

# Fresh process each time (mallopt settings are process-wide and one-way): page
# faults of each of 8 rounds that allocate, fill and free tensors of 4-32 MiB,
# like a learner's per-update activations (92 MiB a round).
SIZES_MIB = (32, 16, 8, 4, 32)
REFILL_FAULTS = textwrap.dedent(
    f"""
    import ctypes, json, resource, sys
    import torch
    from dreamer.system.memory import retain_freed_host_memory

    ctypes.CDLL("libc.so.6").prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE: 4 KiB pages whatever the host's THP

    retained = retain_freed_host_memory() if sys.argv[1] == "retain" else False
    faults = []
    for _ in range(8):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        activations = [torch.empty(n * 2**18).fill_(1.0) for n in {SIZES_MIB}]
        del activations
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(json.dumps({{"retained": retained, "faults": faults}}))
    """
)


def _refill_faults(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", REFILL_FAULTS, mode], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_retained_memory_is_reused_without_page_faults():
    pages = sum(SIZES_MIB) * 2**20 // 4096
    default = _refill_faults("default")
    assert default["retained"] is False
    # By default the rounds fault their pages in again: on average at least half of them (how
    # many in one round depends on glibc's sliding mmap threshold and heap trimming).
    later = default["faults"][2:]
    assert sum(later) / len(later) > pages // 2, default["faults"]
    retained = _refill_faults("retain")
    assert retained["retained"] is True
    assert max(retained["faults"][-3:]) < pages // 20

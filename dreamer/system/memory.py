"""Host memory policy of the learner process (glibc malloc)."""

from __future__ import annotations

import ctypes
import platform

# mallopt parameters, from glibc's malloc.h.
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4


def retain_freed_host_memory() -> bool:
    """Have glibc's malloc serve every allocation from its heap and keep what is freed.

    By default glibc maps each allocation above its mmap threshold (128 KiB,
    rising to 32 MiB) afresh and unmaps it when freed, so every update's large
    activations (a V1 pixel batch's conv maps are ~100 MB each) are page-faulted
    and zeroed by the kernel again, every update: ~200k faults and 0.36 s of
    system time per update on the 2-core box (docs/PERFORMANCE.md). Kept, the
    next update reuses them; the process's RSS stays at its peak instead of
    falling between updates. Returns False where the C library is not glibc.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL("libc.so.6")
    # Each returns 1 on success; both apply to allocations made from now on.
    return bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))

"""Memory of the learner process: how much it may still use (free RAM, cgroup
limits, a GPU's free memory), how much one update takes, and its malloc policy (glibc)."""

from __future__ import annotations

import ctypes
import platform
import resource
import sys
from pathlib import Path

import psutil
import torch

from dreamer.system.cpus import CGROUP_ROOT, own_cgroup_dirs

# mallopt parameters, from glibc's malloc.h.
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4


def retain_freed_host_memory() -> bool:
    """Have glibc's malloc serve every allocation from its heap and keep what is freed.

    By default glibc maps each allocation above its mmap threshold (128 KiB,
    rising to 32 MiB) afresh and unmaps it when freed, so every update's large
    activations (a V1 pixel batch's conv maps are ~100 MB each) are page-faulted
    and zeroed by the kernel again, every update: hundreds of thousands of page
    faults and their system time (docs/PERFORMANCE.md). Kept, the next update
    reuses them; the process's RSS stays at its peak instead of falling between
    updates. Returns False where the C library is not glibc.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL("libc.so.6")
    # Each returns 1 on success; both apply to allocations made from now on.
    return bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))


# cgroup v1 writes "no limit" as the largest page-aligned int64.
_NO_V1_LIMIT = 2**62


def _memory_level(directory: Path) -> tuple[int, int] | None:
    """(headroom, limit) of one cgroup directory's memory limit, or None without one.
    Headroom = limit - working set, the working set being the usage without the
    inactive page cache (reclaimed before the limit is hit), as kubelet counts it."""
    v2, v1 = directory / "memory.max", directory / "memory.limit_in_bytes"
    if v2.is_file():
        text = v2.read_text().strip()
        if text == "max":
            return None
        limit, usage_file, inactive_key = int(text), directory / "memory.current", "inactive_file"
    elif v1.is_file():
        limit = int(v1.read_text().strip())
        if limit >= _NO_V1_LIMIT:
            return None
        usage_file, inactive_key = directory / "memory.usage_in_bytes", "total_inactive_file"
    else:
        return None
    try:
        usage = int(usage_file.read_text().strip())
    except (OSError, ValueError):
        usage = 0
    inactive = 0
    stat = directory / "memory.stat"
    if stat.is_file():
        for line in stat.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == inactive_key:
                inactive = int(value)
    return max(0, limit - max(0, usage - inactive)), limit


def cgroup_memory_headroom(root: Path = CGROUP_ROOT,
                           proc_cgroup: Path = Path("/proc/self/cgroup")) -> tuple[int, int] | None:
    """(bytes this process's cgroups still allow, the limit that allows least), or None
    when no cgroup limits memory. Every level from the process's own cgroup up to the
    root counts: SLURM sets the limit on the job's cgroup, the parent of each step's."""
    tightest = None
    seen: set[Path] = set()
    for directory in own_cgroup_dirs(root, proc_cgroup, "memory"):
        while directory not in seen:
            seen.add(directory)
            level = _memory_level(directory)
            if level is not None and (tightest is None or level[0] < tightest[0]):
                tightest = level
            if directory == root or root not in directory.parents:
                break
            directory = directory.parent
    return tightest


def host_memory_available(root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> tuple[int, str]:
    """(bytes of host memory this process can still take, what limits it): the
    machine's available RAM, or less where a cgroup (SLURM job, container) caps it."""
    free = psutil.virtual_memory().available
    cgroup = cgroup_memory_headroom(root, proc_cgroup)
    if cgroup is not None and cgroup[0] < free:
        return cgroup[0], f"the cgroup memory limit of {cgroup[1] / 2**30:.1f} GiB"
    return free, "free RAM"


def _peak_rss() -> int:
    """This process's resident-set high-water mark, in bytes: Linux's VmHWM (which
    :func:`_reset_peak_rss` can lower to the current RSS), else getrusage's maximum
    (Linux reports KiB, macOS bytes)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _reset_peak_rss() -> bool:
    """Lower this process's VmHWM to its current RSS (Linux >= 4.0: ``5`` to
    /proc/self/clear_refs), so the next peak is this stretch's own; False where
    that is not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class PeakGrowth:
    """How far one stretch of work (an update) lifted memory above where it started,
    on ``device``: host RSS on the CPU, the caching allocator's peak on CUDA.

    ``with PeakGrowth(device) as growth: ...`` then ``growth.bytes``. On the CPU
    this is the process's high-water mark after the stretch minus its RSS before,
    with the mark reset at the start where Linux allows it (exact); elsewhere an
    earlier, higher peak makes it an over-estimate (on the safe side for sizing
    another process).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.bytes = 0

    def __enter__(self) -> PeakGrowth:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
        else:
            _reset_peak_rss()
            self._start = psutil.Process().memory_info().rss
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            peak = _peak_rss()
        self.bytes = max(0, peak - self._start)


def memory_available(device: torch.device) -> tuple[int, str]:
    """(bytes another process could still take on ``device``, what limits it)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free, f"{device} free memory"
    return host_memory_available()

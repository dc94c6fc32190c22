"""How many CPU cores this process may use, and how they are split between
collector workers and learner threads. Decided once at start, and logged.

``os.cpu_count()`` counts every core of the node. On a cluster node that
is wrong three ways: SLURM and ``taskset`` restrict the CPU affinity, a
container or a SLURM cgroup caps CPU time with a quota, and several ranks
(torchrun, one per GPU) share the node. Each rank takes its share of what is
really usable: ``min(affinity, floor(quota)) // ranks_per_node``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def own_cgroup_dirs(root: Path, proc_cgroup: Path, controller: str) -> list[Path]:
    """This process's cgroup directories for ``controller`` ("cpu", "memory"): the v2
    unified path, the v1 path under the controller's mount (``cpu`` or
    ``cpu,cpuacct``), then the root: a container usually sees its own cgroup as
    the root. Some may not exist."""
    dirs: list[Path] = []
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    mounts = [controller] + (["cpu,cpuacct"] if controller == "cpu" else [])
    for line in lines:
        _, controllers, path = line.split(":", 2)
        path = path.lstrip("/")
        if controllers == "":  # cgroup v2
            dirs.append(root / path)
        elif controller in controllers.split(","):  # cgroup v1
            dirs.extend(root / mount / path for mount in mounts)
    return dirs + [root] + [root / mount for mount in mounts]


def cgroup_cpu_quota(root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """CPUs' worth of time the cgroup allows (e.g. 4.0), or None without a quota."""
    for directory in own_cgroup_dirs(root, proc_cgroup, "cpu"):
        v2 = directory / "cpu.max"  # "max 100000" or "400000 100000"
        if v2.is_file():
            quota, _, period = v2.read_text().strip().partition(" ")
            if quota != "max" and period:
                return int(quota) / int(period)
            return None
        v1 = directory / "cpu.cfs_quota_us"  # -1 = no quota
        if v1.is_file():
            quota = int(v1.read_text().strip())
            period_file = directory / "cpu.cfs_period_us"
            if quota > 0 and period_file.is_file():
                return quota / int(period_file.read_text().strip())
            return None
    return None


@dataclass(frozen=True)
class CpuBudget:
    affinity: int  # cores this process may be scheduled on
    quota: float | None  # cgroup CPU quota in cores; None = unlimited
    ranks_per_node: int  # learner processes sharing this node
    cores: int  # this rank's share: what workers and learner threads split

    def describe(self) -> str:
        quota = "none" if self.quota is None else f"{self.quota:g}"
        return (f"cpus: affinity {self.affinity}, cgroup quota {quota}, {self.ranks_per_node} rank(s) per node "
                f"-> {self.cores} for this rank")


def cpu_budget(ranks_per_node: int = 1, *, root: Path = CGROUP_ROOT,
               proc_cgroup: Path = Path("/proc/self/cgroup")) -> CpuBudget:
    """This rank's cores: ``min(affinity, floor(quota)) // ranks_per_node``, at least 1."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_cpu_quota(root, proc_cgroup)
    usable = affinity if quota is None else min(affinity, max(1, math.floor(quota)))
    return CpuBudget(affinity, quota, ranks_per_node, max(1, usable // max(1, ranks_per_node)))


# Collecting in the learner's own process pays while it costs an update less than
# the learner threads a worker process would take save it. A second intra-op
# thread saves even the smallest CPU-scale update more than this, and collecting
# one update's agent steps on Pendulum (states or 64x64 pixels) costs less: at or
# under this line every run collects in the learner. Above it, a larger update's
# gain, measured at start, decides (dreamer.system.thread_gain). The figures
# behind the line: docs/PERFORMANCE.md.
IN_LEARNER_COLLECTION_MAX_S = 0.02


def collects_in_learner(device_type: str, seconds_per_update: float | None, thread_gain_s: float = 0.0) -> bool:
    """Whether a run whose ``collector.num_workers`` is unset steps its env in the
    learner's process: on a CPU learner, when collecting the agent steps one update
    owes (``seconds_per_update``, measured) costs no more than the larger of
    IN_LEARNER_COLLECTION_MAX_S and ``thread_gain_s`` (the seconds an update saves
    on every core instead of one). A GPU learner keeps workers: its threads wait on
    the device, not on each other."""
    if device_type != "cpu" or seconds_per_update is None:
        return False
    return seconds_per_update <= max(IN_LEARNER_COLLECTION_MAX_S, thread_gain_s)


def split_cores(cores: int, num_workers: int | None, threads: int | None, *,
                in_learner: bool = False) -> tuple[int, int]:
    """(collector worker processes, learner intra-op threads) out of ``cores``.

    Unset (None) means: workers = none when ``in_learner`` (cheap collection,
    :func:`collects_in_learner`), else cores minus one for the learner, at least
    one; learner threads = the cores the workers leave free, at least one.
    ``collector.num_workers`` / ``threads`` set by the user win.
    """
    if num_workers is not None:
        workers = num_workers
    else:
        workers = 0 if in_learner else max(1, cores - 1)
    learner_threads = threads if threads is not None else max(1, cores - workers)
    return workers, learner_threads

"""dreamer/system/memory.py: the learner process keeps freed host memory for reuse."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

from tests.support.gpu_checks import REPLAY_SIZE_PER_NODE

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


@pytest.mark.slow
@pytest.mark.timeout(300)
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


# -- how much host memory the learner may still take --------------------------------

GiB = 2**30


def _v2_job(tmp_path, job_limit: str, step_limit: str = "max", current: int = 3 * GiB,
            inactive_file: int = 1 * GiB):
    """A SLURM-like cgroup v2 tree: the limit on the job, the process in its step."""
    step = tmp_path / "slurm" / "job_7" / "step_0"
    step.mkdir(parents=True)
    (step.parent / "memory.max").write_text(f"{job_limit}\n")
    for level in (step, step.parent):
        (level / "memory.current").write_text(f"{current}\n")
        (level / "memory.stat").write_text(f"anon 100\ninactive_file {inactive_file}\nactive_file 5\n")
    (step / "memory.max").write_text(f"{step_limit}\n")
    proc = tmp_path / "proc_cgroup"
    proc.write_text("0::/slurm/job_7/step_0\n")
    return tmp_path, proc


@pytest.mark.gpu_acceptance(REPLAY_SIZE_PER_NODE)
def test_a_job_cgroup_limit_above_the_process_cgroup_counts(tmp_path):
    from dreamer.system.memory import cgroup_memory_headroom

    root, proc = _v2_job(tmp_path, job_limit=str(16 * GiB))
    # 16 GiB limit, 3 GiB used of which 1 GiB is reclaimable page cache.
    assert cgroup_memory_headroom(root, proc) == (14 * GiB, 16 * GiB)


def test_the_tightest_cgroup_limit_wins_and_none_means_unlimited(tmp_path):
    from dreamer.system.memory import cgroup_memory_headroom

    root, proc = _v2_job(tmp_path / "a", job_limit=str(16 * GiB), step_limit=str(8 * GiB))
    assert cgroup_memory_headroom(root, proc) == (6 * GiB, 8 * GiB)
    root, proc = _v2_job(tmp_path / "b", job_limit="max")
    assert cgroup_memory_headroom(root, proc) is None
    assert cgroup_memory_headroom(tmp_path / "c", tmp_path / "missing") is None


def test_cgroup_v1_memory_limit_is_read_from_the_memory_controller(tmp_path):
    from dreamer.system.memory import cgroup_memory_headroom

    job = tmp_path / "memory" / "slurm" / "job_7"
    job.mkdir(parents=True)
    (job / "memory.limit_in_bytes").write_text(f"{32 * GiB}\n")
    (job / "memory.usage_in_bytes").write_text(f"{4 * GiB}\n")
    (job / "memory.stat").write_text(f"cache 7\ntotal_inactive_file {2 * GiB}\n")
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # the root: no limit
    proc = tmp_path / "proc_cgroup"
    proc.write_text("4:memory:/slurm/job_7\n3:cpu,cpuacct:/slurm/job_7\n0::/\n")
    assert cgroup_memory_headroom(tmp_path, proc) == (30 * GiB, 32 * GiB)


@pytest.mark.gpu_acceptance(REPLAY_SIZE_PER_NODE)
def test_available_host_memory_is_the_smaller_of_free_ram_and_the_cgroup_headroom(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from dreamer.system import memory

    root, proc = _v2_job(tmp_path, job_limit=str(16 * GiB))
    monkeypatch.setattr(memory.psutil, "virtual_memory", lambda: SimpleNamespace(available=200 * GiB))
    assert memory.host_memory_available(root, proc) == (14 * GiB, "the cgroup memory limit of 16.0 GiB")
    monkeypatch.setattr(memory.psutil, "virtual_memory", lambda: SimpleNamespace(available=10 * GiB))
    assert memory.host_memory_available(root, proc) == (10 * GiB, "free RAM")


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux's /proc/self/clear_refs")
def test_an_earlier_higher_peak_does_not_inflate_a_stretchs_growth():
    """The compile child is sized by an update's growth: a higher peak from before it (start-up, an
    evaluation) must not count. Where the kernel lets the mark be reset, the growth is the stretch's own."""
    code = ("import torch\nfrom dreamer.system.memory import PeakGrowth\n"
            "x = torch.ones(256 * 2**20)\ndel x\n"  # a 1 GiB peak first
            "with PeakGrowth(torch.device('cpu')) as busy:\n    y = torch.ones(64 * 2**20)\n    del y\n"
            "print(busy.bytes)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert 250 * 2**20 <= int(out.stdout) < 300 * 2**20

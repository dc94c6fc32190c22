"""dreamer/system/cpus.py: workers and learner threads sized from the cores this rank may really use."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers_unit import REPO_ROOT

from dreamer.data.collectors import seconds_per_agent_step
from dreamer.system.cpus import cgroup_cpu_quota, collects_in_learner, cpu_budget, split_cores


def _cgroup_v2(tmp_path: Path, cpu_max: str) -> tuple[Path, Path]:
    """A fake cgroup v2 tree with this process in /job_1, and its /proc/self/cgroup."""
    (tmp_path / "job_1").mkdir(parents=True)
    (tmp_path / "job_1" / "cpu.max").write_text(cpu_max + "\n")
    proc = tmp_path / "proc_cgroup"
    proc.write_text("0::/job_1\n")
    return tmp_path, proc


def _cgroup_v1(tmp_path: Path, quota_us: int, period_us: int = 100_000) -> tuple[Path, Path]:
    cpu = tmp_path / "cpu,cpuacct" / "slurm" / "job_7"
    cpu.mkdir(parents=True)
    (cpu / "cpu.cfs_quota_us").write_text(f"{quota_us}\n")
    (cpu / "cpu.cfs_period_us").write_text(f"{period_us}\n")
    proc = tmp_path / "proc_cgroup"
    proc.write_text("4:memory:/slurm/job_7\n3:cpu,cpuacct:/slurm/job_7\n0::/\n")
    return tmp_path, proc


def test_cgroup_v2_quota_is_read_from_this_process_cgroup(tmp_path):
    root, proc = _cgroup_v2(tmp_path, "250000 100000")
    assert cgroup_cpu_quota(root, proc) == 2.5
    (root / "job_1" / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_quota(root, proc) is None


def test_cgroup_v1_quota_is_read_from_the_cpu_controller(tmp_path):
    root, proc = _cgroup_v1(tmp_path, 300_000)
    assert cgroup_cpu_quota(root, proc) == 3.0
    root, proc = _cgroup_v1(tmp_path / "unlimited", -1)
    assert cgroup_cpu_quota(root, proc) is None


def test_no_cgroup_files_means_no_quota(tmp_path):
    assert cgroup_cpu_quota(tmp_path, tmp_path / "missing") is None


def test_a_quota_below_the_affinity_caps_the_budget(tmp_path, monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(224)))
    root, proc = _cgroup_v2(tmp_path, "1600000 100000")  # a 16-core SLURM allocation on a 224-thread node
    budget = cpu_budget(1, root=root, proc_cgroup=proc)
    assert (budget.affinity, budget.quota, budget.cores) == (224, 16.0, 16)
    assert "affinity 224, cgroup quota 16" in budget.describe()


def test_ranks_on_a_node_share_its_cores(tmp_path, monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(224)))
    root, proc = _cgroup_v2(tmp_path, "max 100000")
    budget = cpu_budget(8, root=root, proc_cgroup=proc)  # torchrun, 8 GPUs: LOCAL_WORLD_SIZE=8
    assert budget.cores == 28
    assert split_cores(budget.cores, None, None) == (27, 1)


def test_a_fractional_quota_rounds_down_but_never_to_zero(tmp_path, monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    root, proc = _cgroup_v2(tmp_path, "150000 100000")
    assert cpu_budget(1, root=root, proc_cgroup=proc).cores == 1
    root, proc = _cgroup_v2(tmp_path / "half", "50000 100000")
    assert cpu_budget(4, root=root, proc_cgroup=proc).cores == 1


def test_split_cores_leaves_the_learner_what_workers_do_not_take():
    assert split_cores(2, None, None) == (1, 1)
    assert split_cores(1, None, None) == (1, 1)
    assert split_cores(16, None, None) == (15, 1)
    assert split_cores(16, 4, None) == (4, 12)
    assert split_cores(16, 0, None) == (0, 16)  # in-process collection: the learner takes every core
    assert split_cores(16, 4, 2) == (4, 2)


def test_cheap_collection_on_a_cpu_learner_gives_the_learner_every_core():
    assert split_cores(2, None, None, in_learner=True) == (0, 2)
    assert split_cores(2, 1, None, in_learner=True) == (1, 1)  # the user's num_workers wins
    assert collects_in_learner("cpu", 0.002)  # Pendulum states: ~2 ms per update
    assert not collects_in_learner("cpu", 0.2)  # an env step slower than a worker's share of the learner
    assert not collects_in_learner("cpu", None)  # not measured: num_workers set
    assert not collects_in_learner("cuda", 0.002)  # a GPU learner overlaps collection in workers


def test_collection_cost_is_measured_on_the_env_and_policy_a_run_steps():
    from torchrl.envs import GymEnv
    from torchrl.envs.utils import RandomPolicy

    env = GymEnv("Pendulum-v1")
    random = RandomPolicy(env.action_spec)
    cost = seconds_per_agent_step(env, random)
    assert 0 < cost < 0.01  # a Pendulum step: tens of microseconds

    def slow(td):
        time.sleep(0.02)
        return random(td)

    assert 0.02 <= seconds_per_agent_step(env, slow) < 0.2
    env.close()


@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs util-linux's taskset")
def test_taskset_restricts_the_budget():
    code = "from dreamer.system.cpus import cpu_budget; print(cpu_budget(1).affinity, cpu_budget(1).cores)"
    out = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO_ROOT, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1", "1"]

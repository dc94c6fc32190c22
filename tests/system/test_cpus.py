"""dreamer/system/cpus.py: workers and learner threads sized from the cores this rank may really use."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from dreamer.data.collectors import seconds_per_agent_step
from dreamer.system.cpus import cgroup_cpu_quota, collects_in_learner, cpu_budget, split_cores
from dreamer.system.thread_gain import MAX_PROBE_SAMPLES, UPDATE_OVER_POLICY_PASS, update_thread_gain_s
from tests.support.gpu_checks import WORKERS_AND_THREADS
from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.gpu_acceptance(WORKERS_AND_THREADS)


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


def test_collection_dearer_than_the_line_stays_in_the_learner_when_the_threads_save_an_update_more():
    # 64x64 DMC pixels: ~44 ms of rendering and policy per update, against an update
    # of over a second that a second thread shortens by far more.
    assert collects_in_learner("cpu", 0.044, thread_gain_s=0.3)
    assert not collects_in_learner("cpu", 0.2, thread_gain_s=0.1)  # the worker's parallel collection wins
    assert collects_in_learner("cpu", 0.015, thread_gain_s=0.001)  # under the fixed line whatever the gain
    assert not collects_in_learner("cuda", 0.044, thread_gain_s=0.3)


class _ThreadBoundPolicy:
    """A policy pass whose wall time divides by the intra-op threads, as a batched
    conv encoder's nearly does; it records the batch sizes it saw."""

    def __init__(self, one_thread_s: float):
        self.one_thread_s, self.batches = one_thread_s, []

    def __call__(self, td):
        self.batches.append(td.shape[0])
        time.sleep(self.one_thread_s / torch.get_num_threads())
        return td


def test_the_thread_gain_is_what_every_core_saves_a_pass_scaled_to_an_update():
    policy = _ThreadBoundPolicy(one_thread_s=0.04)
    step = TensorDict({"observation": torch.zeros(1, 3)}, batch_size=[1])
    kept = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        gain = update_thread_gain_s(policy, step, samples=512, cores=2)
        assert torch.get_num_threads() == 2  # left as found
    finally:
        torch.set_num_threads(kept)
    # one pass: 40 ms on one thread, 20 on two; the probe runs 256 samples (its cap),
    # an update 512, and repeats the pass's ops forward and backward (x3): 3 x 20 x 2.
    assert gain == pytest.approx(UPDATE_OVER_POLICY_PASS * 0.02 * 512 / MAX_PROBE_SAMPLES, rel=0.25)
    assert set(policy.batches) == {MAX_PROBE_SAMPLES}
    assert update_thread_gain_s(policy, step, samples=512, cores=1) == 0.0  # one core: nothing to gain


def test_the_gain_is_measured_only_where_it_decides():
    from dreamer.config import Config
    from dreamer.run.build import describe_collection, learner_thread_gain

    cfg = Config()

    def must_not_run(td):
        raise AssertionError("probed although collection is under the fixed line")

    assert learner_thread_gain(cfg, None, must_not_run, collect_s=0.005, cores=2) == 0.0
    assert learner_thread_gain(cfg, None, must_not_run, collect_s=None, cores=2) == 0.0
    line = describe_collection(cfg, 0.044, workers=0, thread_gain_s=0.3)
    assert "44.0 ms <= an update's gain from the learner's threads, 300 ms: in the learner's process" in line
    assert "31.0 ms > 20 ms: in worker processes" in describe_collection(cfg, 0.031, workers=1)


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

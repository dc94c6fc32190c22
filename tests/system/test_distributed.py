"""dreamer/system/distributed.py: data-parallel learners under torchrun (CPU, gloo)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dreamer.system.distributed import GradientAverager, Ranks, ranks_from_env
from tests.support.processes import ROOT, read_metrics


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ranks_come_from_torchrun_environment():
    assert ranks_from_env({}) == Ranks(0, 1, 0) and not ranks_from_env({}).enabled
    ranks = ranks_from_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert ranks.enabled and not ranks.is_main and ranks.local_rank == 1


def test_each_rank_and_worker_collects_from_its_own_env_seed(monkeypatch):
    """Data-parallel ranks must learn from different data, or max_param_divergence == 0
    would prove nothing about gradient averaging: the env factories make_collector
    hands each worker of each rank start from different first observations."""
    from dreamer.config import Config
    from dreamer.data import collectors

    built = {}

    class FakeMulti:
        def __init__(self, factories, **kwargs):
            self.factories = factories

    monkeypatch.setattr(collectors, "WorkerCollector", FakeMulti)
    cfg = Config()
    first_obs = {}
    for rank in (0, 1):
        fake = collectors.make_collector(cfg.collector, cfg.env, cfg.algo, cfg.compile, policy=None, seed=0,
                                         workers=2, random_frames=0, learner_threads=1, rank=rank)
        for worker, factory in enumerate(fake.factories):
            built[rank, worker] = factory.keywords["seed"]
            env = factory()
            first_obs[rank, worker] = env.reset()["observation"]
            env.close()
    assert len(set(built.values())) == 4, built
    obs = list(first_obs.values())
    assert all(not torch.equal(a, b) for i, a in enumerate(obs) for b in obs[i + 1:]), first_obs


def _average_on_rank(rank: int, port: int, out) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    used, unused = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))
    used.grad = torch.full((3,), float(rank + 1))  # rank 0: 1s, rank 1: 2s
    if rank == 1:
        unused.grad = torch.full((2,), 4.0)  # rank 0 has no gradient for it
    GradientAverager(2)([used, unused])
    out.put((rank, used.grad.tolist(), unused.grad.tolist()))
    dist.destroy_process_group()


def test_gradients_are_averaged_across_ranks_even_where_one_has_none():
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_average_on_rank, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert results == [(0, [1.5] * 3, [2.0] * 2), (1, [1.5] * 3, [2.0] * 2)]


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_torchrun_two_cpu_ranks_finish_in_lockstep_and_rank0_alone_writes(tmp_path):
    # Each rank gets its own run dir (RANK in the path), so what rank 1 writes can be seen apart.
    # Pendulum's state vector: what is observed is not this test's subject.
    run_dir, rank1_dir = tmp_path / "run0", tmp_path / "run1"
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
         "-m", "dreamer", "experiment=smoke", "env=pendulum", "compile=off", "train.total_frames=250",
         "eval.video=false", "logger.progress_bar=false", f"hydra.run.dir={tmp_path}/run${{oc.env:RANK}}"],
        cwd=ROOT, env={**os.environ, "SDL_VIDEODRIVER": "dummy", "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr[-3000:]  # torchrun: every rank exited 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["updates"] > 0
    # Each rank learned from its own collectors' data; averaged gradients kept the weights equal.
    assert summary["max_param_divergence"] == 0.0
    updates = [m["updates"] for m in read_metrics(run_dir) if "loss_model_kl" in m]
    assert updates and len(updates) == len(set(updates))  # one writer
    assert len(list((run_dir / "checkpoints").glob("ckpt_*.pt"))) >= 1
    # Rank 1 ran in its own run dir (Hydra wrote its .hydra/ there) and wrote no checkpoint, metrics or summary.
    assert (rank1_dir / ".hydra" / "config.yaml").is_file()
    written = {p.relative_to(rank1_dir).as_posix() for p in rank1_dir.rglob("*") if p.is_file()}
    assert not [p for p in written if p.startswith("checkpoints/") or p.endswith((".pt", ".jsonl", ".csv"))
                or p in ("summary.json", "config.json")], written
    # Frames count per rank: rank 0 collected train.total_frames itself, within one of its
    # own batches (a count summed over both ranks would stop it near half of that).
    cfg = json.loads((run_dir / "config.json").read_text())
    batch_frames = cfg["collector"]["frames_per_batch"] * cfg["collector"]["num_workers"] * cfg["env"]["action_repeat"]
    assert 250 <= summary["frames"] < 250 + batch_frames


SUBMITIT_TASK_1_OF_2 = {
    "SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_JOB_ID": "4242", "SUBMITIT_LOCAL_NTASKS": "2",
    "SUBMITIT_LOCAL_GLOBALID": "1", "SUBMITIT_LOCAL_LOCALID": "1", "SUBMITIT_LOCAL_NODEID": "0",
    "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
}


def test_a_multi_task_submitit_job_is_one_data_parallel_run(monkeypatch):
    """hydra/launcher=slurm (or submitit_local) with tasks_per_node=2: the tasks are the
    ranks of one job, with torch's env:// variables taken from submitit's job environment."""
    from dreamer.system.distributed import export_scheduler_ranks

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    for key, value in SUBMITIT_TASK_1_OF_2.items():
        monkeypatch.setenv(key, value)  # submitit's JobEnvironment reads the process environment
    environ = dict(os.environ)  # exported into a copy: the ranks must not leak into later tests' processes
    assert export_scheduler_ranks(environ)
    assert ranks_from_env(environ) == Ranks(rank=1, world_size=2, local_rank=1, local_world_size=2)
    assert environ["MASTER_ADDR"] and int(environ["MASTER_PORT"]) > 0
    assert "RANK" not in os.environ


def test_one_task_jobs_and_torchrun_are_left_alone(monkeypatch):
    from dreamer.system.distributed import export_scheduler_ranks

    for key, value in {**SUBMITIT_TASK_1_OF_2, "SUBMITIT_LOCAL_NTASKS": "1", "SUBMITIT_LOCAL_GLOBALID": "0",
                       "SUBMITIT_LOCAL_LOCALID": "0"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("RANK", raising=False)
    environ = dict(os.environ)
    assert not export_scheduler_ranks(environ) and "RANK" not in environ
    torchrun = {**SUBMITIT_TASK_1_OF_2, "RANK": "3", "WORLD_SIZE": "4"}
    assert not export_scheduler_ranks(torchrun) and torchrun["RANK"] == "3"

"""Data-parallel whole updates (compile.update=whole, dreamer/system/distributed.py): the
gradient all-reduce runs inside the compiled graph, between backward and the
optimiser steps, and two gloo ranks learning from different batches keep
bit-identical parameters."""

from __future__ import annotations

import queue
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

UPDATES = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _whole_updates_on_rank(rank: int, port: int, out) -> None:
    from torch._dynamo.utils import counters

    from dreamer.algos.v3.learner import DreamerV3Learner
    from dreamer.algos.v3.models import build_models
    from dreamer.config import validate
    from dreamer.data.replay import stored_keys
    from dreamer.envs.factory import close_env, make_env
    from dreamer.system import distributed
    from tests.support.configs import tiny_config

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        cfg = tiny_config(algo="dreamer_v3")
        a = cfg.algo
        a.num_categoricals, a.num_classes, a.num_bins, a.mlp_layers, a.lr_warmup_steps = 4, 4, 31, 1, 0
        a.imagination_horizon = 1  # the all-reduce is the subject: the shortest rollout to trace
        c = cfg.compile
        c.enabled, c.backend, c.update, c.warmup_iters = True, "eager", "whole", 1
        cfg = validate(cfg)
        env = make_env(cfg.env, cfg.algo, seed=rank)
        try:
            torch.manual_seed(rank)  # each rank its own weights, until the broadcast, and its own batch
            models = build_models(cfg.algo, cfg.env, env, torch.device("cpu"))
            with torch.no_grad():
                rollout = env.rollout(cfg.buffer.batch_size * cfg.buffer.batch_length, models.policy(explore=True),
                                      break_when_any_done=False)
        finally:
            close_env(env)
        batch = rollout.select(*stored_keys(models.obs_key), strict=False)
        learner = DreamerV3Learner(cfg.algo, cfg.compile, models, torch.device("cpu"),
                                   batch_size=cfg.buffer.batch_size, batch_length=cfg.buffer.batch_length)
        distributed.broadcast_module(models.modules)  # as build_run starts every rank
        learner.grad_sync = distributed.GradientAverager(2)
        learner.compile()
        learner.warmup(batch.clone())
        start = torch.cat([p.detach().reshape(-1).clone() for p in models.modules.parameters()])
        for _ in range(UPDATES):
            learner.update(batch.clone())
        moved = torch.cat([p.detach().reshape(-1) for p in models.modules.parameters()])
        out.put((rank, distributed.max_divergence(models.modules), bool((moved != start).any()),
                 counters["stats"]["unique_graphs"], dict(counters["graph_break"])))
    finally:
        dist.destroy_process_group()


def _results(out, procs, deadline: float) -> list:
    """One result per rank; fails at once when a rank dies without one (its
    traceback is in the captured stderr) instead of waiting out the deadline."""
    results = []
    while len(results) < len(procs):
        try:
            results.append(out.get(timeout=5))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            assert not dead, f"a rank exited with {dead} before reporting (its traceback is above)"
            assert time.monotonic() < deadline, "the ranks reported nothing in time"
    return results


@pytest.mark.slow
@pytest.mark.trace
def test_ranks_stay_bit_identical_through_compiled_whole_updates_on_different_batches():
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_whole_updates_on_rank, args=(rank, port, out)) for rank in range(2)]
    for p in procs:
        p.start()
    try:
        results = sorted(_results(out, procs, deadline=time.monotonic() + 1200))
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.exitcode is None:
                p.kill()
    for rank, divergence, moved, graphs, breaks in results:
        assert divergence == 0.0, f"rank {rank}: parameters differ from rank 0's by {divergence}"
        assert moved, f"rank {rank}: the updates moved no parameter"
        assert graphs == 1 and not breaks, (rank, graphs, breaks)  # the all-reduce inside the one graph

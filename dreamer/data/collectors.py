"""Collectors: spawned worker processes stepping envs with the current policy.

Created before anything in the main process touches torch.compile / dynamo,
so workers start clean (spawn, not fork) and never inherit compiler state.
"""

from __future__ import annotations

import copy
import functools
import statistics
import time
from typing import Callable

import torch
from tensordict.nn import TensorDictModuleBase
from torchrl.collectors import BaseCollector, Collector
from torchrl.envs import EnvBase

from dreamer.config import AlgoConfig, CollectorConfig, CompileConfig, EnvConfig
from dreamer.envs.factory import env_factory
from dreamer.system.compile import compile_kwargs
from torchrl_ext import (
    NonBlockingSharedMemWeightSyncScheme,
    SchemeClosingMultiAsyncCollector,
    WorkerTaggingMultiAsyncCollector,
    module_to,
)
from torchrl_ext.tensordict_fast_path import install_from_any_fast_path


class WorkerCollector(SchemeClosingMultiAsyncCollector, WorkerTaggingMultiAsyncCollector):
    """The run's multi-process collector: its batches say which worker (which env's
    stream) they come from, and its shutdown closes its weight sync schemes."""


def workers_hold_a_copy(learner_device: torch.device, collector_device: torch.device) -> bool:
    """Workers act with a copy of the policy on their own device (weights pushed from
    the learner's) unless they share the learner's device."""
    return learner_device != collector_device


def worker_policy(
    policy: TensorDictModuleBase, learner_device: torch.device, collector_device: torch.device,
) -> tuple[TensorDictModuleBase, TensorDictModuleBase | None]:
    """(what the workers receive, the policy whose weights are pushed to them).

    On one device the workers get the learner's own modules (on CPU they read
    them through shared memory) and the second item is None. Otherwise they get
    a copy with everything on the collector device, plain tensor attributes and
    specs included (``torchrl_ext.module_to``), so no GPU tensor reaches a CPU
    worker, and each weight push sends ``policy``'s current weights.
    """
    if not workers_hold_a_copy(learner_device, collector_device):
        return policy, None
    return module_to(copy.deepcopy(policy), collector_device), policy


@torch.no_grad()
def seconds_per_agent_step(env: EnvBase, policy: TensorDictModuleBase, steps: int = 16, warmup: int = 4) -> float:
    """Wall seconds one agent step costs in this process: the env (its action
    repeat, rendering and transforms included) and the acting policy. The median
    of ``steps`` steps after ``warmup`` (first calls allocate): a busy machine
    descheduling one step does not change the answer."""
    times = []
    td = env.reset()
    for i in range(warmup + steps):
        start = time.perf_counter()
        _, td = env.step_and_maybe_reset(policy(td))
        times.append(time.perf_counter() - start)
    return statistics.median(times[warmup:])


def _start_worker(worker_init: Callable | None) -> None:
    """What every collector worker runs first: the tensordict fast path the learner's process has
    (its policy writes module outputs too), then the caller's ``worker_init``."""
    install_from_any_fast_path()
    if worker_init is not None:
        worker_init()


def make_collector(
    collector_cfg: CollectorConfig, env_cfg: EnvConfig, algo_cfg: AlgoConfig, compile_cfg: CompileConfig,
    policy: TensorDictModuleBase, *, seed: int, workers: int, random_frames: int, learner_threads: int,
    worker_hook: Callable | None = None, worker_init: Callable | None = None, rank: int = 0,
) -> BaseCollector:
    """An endless collector of ``workers`` processes (0 = in the calling
    process) yielding (frames_per_batch,) batches from one env each.

    ``random_frames`` agent steps (summed over workers) use random actions
    first; 0 on resume. ``worker_init`` runs once in each worker process at its
    start; ``worker_hook`` runs in each worker process after each
    of its rollouts (the profiler's tracer); an in-process collector (0
    workers) does not run it, as the learner's own trace covers collection.
    ``rank`` (data-parallel learners) gives each rank's workers their own env
    seeds; ``algo_cfg`` sizes the policy's carry in every env. With workers,
    ``update_policy_weights_`` does not wait: it stages the weights, and
    :func:`publish_pending_weights` (polled by the caller) completes the push.
    """
    c = collector_cfg
    factories = [
        env_factory(env_cfg, algo_cfg, seed=seed + 1000 * (i + 1) + 100_000 * rank)
        for i in range(max(workers, 1))
    ]
    common = dict(
        policy=policy,
        # Compiled in each worker process, never shipped compiled (torchrl
        # wraps it with compile_with_warmup: the first call runs eager).
        compile_policy=compile_kwargs(compile_cfg) if c.compile_policy else None,
        total_frames=-1,
        init_random_frames=random_frames,
        policy_device=torch.device(c.device),
        env_device=torch.device("cpu"),
        storing_device=torch.device("cpu"),
        # Our envs count steps (an episode starts at step_count 0) and the policy carries its own recurrent
        # state: the env is stepped as built (torchrl 0.15 would append an InitTracker and
        # primers by default; 0.14 warns that it would).
        auto_register_policy_transforms=False,
    )
    if workers == 0:
        return Collector(factories[0], frames_per_batch=c.frames_per_batch, **common)
    # Weight pushes never wait for the workers (nor for a GPU learner's device-to-host
    # copy): staged, then published once ready (publish_pending_weights).
    weight_sync = NonBlockingSharedMemWeightSyncScheme()
    collector = WorkerCollector(
        factories,
        post_collect_hook=worker_hook,
        frames_per_batch=[c.frames_per_batch] * workers,
        # Without this torchrl resets the main process to (threads - workers).
        num_threads=learner_threads,
        num_sub_threads=1,
        init_fn=functools.partial(_start_worker, worker_init),
        weight_sync_schemes={"policy": weight_sync},
        **common,
    )
    weight_sync.is_alive = lambda idx: collector.procs[idx].is_alive()
    collector.weight_push = weight_sync  # read by publish_pending_weights
    return collector


def publish_pending_weights(collector: BaseCollector) -> bool:
    """Complete a weight push that ``update_policy_weights_`` staged, if it is ready
    (never waits); True when it published. A no-op for in-process collection."""
    push = getattr(collector, "weight_push", None)
    return push.publish_ready() if push is not None else False

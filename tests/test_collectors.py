"""Collector workers are spawned clean and stay free of dynamo state while the learner compiles."""

from __future__ import annotations

import os

import pytest
import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn

from dreamer.algos.v1.learner import DreamerV1Learner
from dreamer.algos.v1.models import build_models
from dreamer.config import Config
from dreamer.data.collectors import make_collector, worker_policy
from dreamer.data.replay import make_replay_buffer, write
from dreamer.envs.factory import make_env

# Set by the test in the parent before workers start: a forked worker would
# inherit True, a spawned one re-imports this module and sees False.
PARENT_STATE_TOUCHED = False


class DynamoProbe(nn.Module):
    """Reports, from inside whichever process runs the policy, its pid, how many
    frames dynamo has compiled there, and whether it inherited parent state."""

    @torch._dynamo.disable  # read the live counter even inside a compiled policy
    def forward(self, action: torch.Tensor) -> tuple[torch.Tensor, ...]:
        import torch._dynamo.utils as dynamo_utils

        frames = dynamo_utils.counters["frames"]["total"]
        lead = action.shape[:-1]
        return (torch.full(lead, os.getpid(), dtype=torch.int64),
                torch.full(lead, frames, dtype=torch.int64),
                torch.full(lead, PARENT_STATE_TOUCHED, dtype=torch.bool))


def tiny_config() -> Config:
    cfg = Config()
    cfg.algo.state_dim, cfg.algo.rssm_hidden_dim, cfg.algo.hidden_dim = 4, 8, 16
    cfg.algo.imagination_horizon = 3
    cfg.buffer.batch_size, cfg.buffer.batch_length, cfg.buffer.capacity = 2, 5, 1000
    cfg.collector.num_workers, cfg.collector.frames_per_batch = 1, 20
    cfg.compile.backend = "aot_eager"  # a real dynamo compile, without C++ codegen time
    cfg.compile.options = None
    cfg.compile.warmup_iters = 1
    return cfg


def test_workers_hold_no_dynamo_state_while_the_learner_compiles():
    import torch._dynamo.utils as dynamo_utils

    global PARENT_STATE_TOUCHED
    PARENT_STATE_TOUCHED = True

    cfg = tiny_config()
    env = make_env(cfg.env, cfg.algo)
    models = build_models(cfg.algo, cfg.env, env, torch.device("cpu"))
    probe = TensorDictModule(DynamoProbe(), in_keys=["action"], out_keys=["probe_pid", "probe_dynamo_frames", "probe_inherited"])
    policy = TensorDictSequential(models.policy(explore=True), probe)
    collector = make_collector(
        cfg.collector, cfg.env, cfg.algo, cfg.compile, policy, seed=cfg.seed,
        workers=cfg.collector.num_workers, random_frames=0, learner_threads=1,
    )
    replay = make_replay_buffer(cfg.buffer, torch.device("cpu"))
    try:
        batches = iter(collector)
        first = next(batches)
        write(replay, first, models.obs_key)
        while len(replay) < 40:
            write(replay, next(batches), models.obs_key)

        learner = DreamerV1Learner(cfg.algo, cfg.compile, models, torch.device("cpu"), batch_size=cfg.buffer.batch_size, batch_length=cfg.buffer.batch_length)
        learner.compile()
        learner.warmup(replay.sample())
        compiled_here = dynamo_utils.counters["frames"]["total"]
        assert compiled_here > 0, "the learner did not compile anything"

        collector.update_policy_weights_()
        later = next(batches)
    finally:
        collector.shutdown()
    for batch in (first, later):
        assert (batch["probe_pid"] != os.getpid()).all(), "the policy ran in the main process"
        assert (batch["probe_dynamo_frames"] == 0).all(), "a worker compiled frames with dynamo"
        assert not batch["probe_inherited"].any(), "workers were forked, not spawned"


class WeightProbe(nn.Module):
    """Writes its own (trainable) scalar into every step: what the worker holds."""

    def __init__(self):
        super().__init__()
        self.marker = nn.Parameter(torch.zeros(()))

    def forward(self, action: torch.Tensor) -> torch.Tensor:
        return self.marker.detach().expand(action.shape[:-1]).clone()


@pytest.mark.parametrize("workers_hold_a_copy", [False, True])
def test_workers_act_with_the_weights_the_learner_pushes(workers_hold_a_copy):
    """Same device: workers read the learner's modules. Another device (a GPU learner):
    workers hold a copy on theirs and each push sends the learner's weights; forced
    here on CPU by naming another learner device."""
    cfg = tiny_config()
    env = make_env(cfg.env, cfg.algo)
    models = build_models(cfg.algo, cfg.env, env, torch.device("cpu"))
    probe = WeightProbe()
    policy = TensorDictSequential(
        models.policy(explore=True),
        TensorDictModule(probe, in_keys=["action"], out_keys=["probe_marker"]),
    )
    learner_device = torch.device("meta" if workers_hold_a_copy else "cpu")  # only compared, never used
    sent, source = worker_policy(policy, learner_device, torch.device("cpu"))
    assert (sent is not policy) == workers_hold_a_copy and (source is policy) == workers_hold_a_copy
    collector = make_collector(
        cfg.collector, cfg.env, cfg.algo, cfg.compile, sent, seed=cfg.seed,
        workers=cfg.collector.num_workers, random_frames=0, learner_threads=1,
    )
    try:
        batches = iter(collector)
        assert (next(batches)["probe_marker"] == 0).all()
        with torch.no_grad():
            probe.marker.fill_(7.0)  # what an optimiser step does to the learner's copy
        if source is None:
            collector.update_policy_weights_()
        else:
            collector.update_policy_weights_(source)
        # A batch already in flight may predate the push; the next ones must not.
        next(batches)
        assert (next(batches)["probe_marker"] == 7.0).all()
    finally:
        collector.shutdown()


def test_compile_policy_compiles_inside_each_worker_not_in_the_parent():
    import torch._dynamo.utils as dynamo_utils

    cfg = tiny_config()
    cfg.collector.compile_policy = True
    env = make_env(cfg.env, cfg.algo)
    models = build_models(cfg.algo, cfg.env, env, torch.device("cpu"))
    probe = TensorDictModule(DynamoProbe(), in_keys=["action"], out_keys=["probe_pid", "probe_dynamo_frames", "probe_inherited"])
    policy = TensorDictSequential(models.policy(explore=True), probe)
    frames_before = dynamo_utils.counters["frames"]["total"]
    collector = make_collector(
        cfg.collector, cfg.env, cfg.algo, cfg.compile, policy, seed=cfg.seed,
        workers=cfg.collector.num_workers, random_frames=0, learner_threads=1,
    )
    try:
        batches = iter(collector)
        for _ in range(3):
            batch = next(batches)
    finally:
        collector.shutdown()
    # The worker compiled its own policy (frames counted in the worker)...
    assert (batch["probe_dynamo_frames"] > 0).all()
    # ...and the parent compiled nothing for it.
    assert dynamo_utils.counters["frames"]["total"] == frames_before


def _reachable_tensors(obj, path="policy", seen=None, out=None):
    """(path, device) of every tensor reachable from ``obj`` through torch/TorchRL/our objects."""
    seen, out = (set() if seen is None else seen), ([] if out is None else out)
    if id(obj) in seen:
        return out
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        out.append((path, obj.device))
    elif isinstance(obj, dict):
        for key, value in obj.items():
            _reachable_tensors(value, f"{path}[{key!r}]", seen, out)
    elif isinstance(obj, (list, tuple, set)):
        for index, value in enumerate(obj):
            _reachable_tensors(value, f"{path}[{index}]", seen, out)
    elif type(obj).__module__.split(".")[0] in ("torch", "torchrl", "tensordict", "dreamer", "torchrl_ext"):
        for key, value in getattr(obj, "__dict__", {}).items():
            _reachable_tensors(value, f"{path}.{key}", seen, out)
    return out


@pytest.mark.parametrize("algo", ["dreamer_v1", "dreamer_v3"])
@pytest.mark.parametrize("pixels", [False, True])
def test_what_workers_receive_holds_no_tensor_off_the_collector_device(algo, pixels):
    """A GPU learner's policy sent to CPU workers: every tensor the workers get is on
    the collector device, also the plain attributes nn.Module.to leaves behind (V1's
    TanhNormal bounds and exploration spec): else each worker opens a CUDA context
    and copies device-to-host at every step. ``meta`` stands in for the other device."""
    from helpers_unit import close_env
    from helpers_unit import tiny_config as tiny_unit_config

    from dreamer.algos.registry import algorithm

    cfg = tiny_unit_config(pixels=pixels, algo=algo)
    env = make_env(cfg.env, cfg.algo)
    try:
        build, _ = algorithm(algo)
        models = build(cfg.algo, cfg.env, env, torch.device("cpu"))
    finally:
        close_env(env)
    learner_policy = models.policy(explore=True)
    sent, _ = worker_policy(learner_policy, torch.device("cpu"), torch.device("meta"))
    elsewhere = [path for path, device in _reachable_tensors(sent) if device.type != "meta"]
    assert not elsewhere, elsewhere[:5]
    assert {d.type for _, d in _reachable_tensors(learner_policy)} == {"cpu"}  # the learner's stays put

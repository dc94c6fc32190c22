"""Collector workers are spawned clean and stay free of dynamo state while the learner compiles."""

from __future__ import annotations

import copy
import os
import queue
import time

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn

from dreamer.algos.v1.learner import DreamerV1Learner
from dreamer.algos.v1.models import build_models
from dreamer.config import Config, DreamerV1Config
from dreamer.data.collectors import make_collector, publish_pending_weights, worker_policy
from dreamer.data.replay import make_replay_buffer, write
from dreamer.envs.factory import close_env, make_env
from tests.support.gpu_checks import WEIGHT_PUSH_CUDA, WEIGHT_PUSH_NEVER_WAITS, WORKER_POLICY_DEVICE

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
    cfg = Config(algo=DreamerV1Config())
    cfg.algo.state_dim, cfg.algo.rssm_hidden_dim, cfg.algo.hidden_dim = 4, 8, 16
    cfg.algo.imagination_horizon = 3
    cfg.buffer.batch_size, cfg.buffer.batch_length, cfg.buffer.capacity = 2, 5, 1000
    cfg.collector.num_workers, cfg.collector.frames_per_batch = 1, 20
    cfg.compile.enabled = True
    cfg.compile.backend = "eager"  # dynamo traces frames (the state these tests are about); no AOT, no C++
    cfg.compile.options = None
    cfg.compile.warmup_iters = 1
    return cfg


def test_the_collector_steps_the_env_as_built_whatever_torchrls_transform_default():
    """Our envs count steps (an episode starts at ``step_count`` 0) and the policy keeps its own carry:
    the collector appends nothing (torchrl 0.15 flips its default to append an InitTracker and
    recurrent-state primers; today it warns that it would)."""
    import warnings

    cfg = tiny_config()
    cfg.compile.enabled = False
    env = make_env(cfg.env, cfg.algo)
    models = build_models(cfg.algo, cfg.env, env, torch.device("cpu"))
    close_env(env)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        collector = make_collector(cfg.collector, cfg.env, cfg.algo, cfg.compile, models.policy(explore=True),
                                   seed=cfg.seed, workers=0, random_frames=0, learner_threads=1)
    try:
        batch = next(iter(collector))
    finally:
        collector.shutdown()
    assert "step_count" in batch.keys() and "is_init" not in batch.keys(include_nested=True)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_workers_hold_no_dynamo_state_while_the_learner_compiles():
    import torch._dynamo.utils as dynamo_utils

    global PARENT_STATE_TOUCHED
    PARENT_STATE_TOUCHED = True

    cfg = tiny_config()
    env = make_env(cfg.env, cfg.algo)
    models = build_models(cfg.algo, cfg.env, env, torch.device("cpu"))
    probe = TensorDictModule(DynamoProbe(), in_keys=["action"],
                             out_keys=["probe_pid", "probe_dynamo_frames", "probe_inherited"])
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

        learner = DreamerV1Learner(cfg.algo, cfg.compile, models, torch.device("cpu"),
                                   batch_size=cfg.buffer.batch_size, batch_length=cfg.buffer.batch_length)
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


@pytest.mark.slow
@pytest.mark.timeout(300)
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

    def push():
        if source is None:
            collector.update_policy_weights_()
        else:
            collector.update_policy_weights_(source)

    try:
        batches = iter(collector)
        assert (next(batches)["probe_marker"] == 0).all()
        with torch.no_grad():
            probe.marker.fill_(7.0)  # what an optimiser step does to the learner's copy
        push()
        # A batch already in flight may predate the push; the next ones must not.
        next(batches)
        assert (next(batches)["probe_marker"] == 7.0).all()
        # A second push right away: staged until the workers acknowledged the first,
        # published by the loop's polls, never waited for.
        with torch.no_grad():
            probe.marker.fill_(9.0)
        push()
        deadline = time.monotonic() + 60
        while collector.weight_push._staged is not None:
            assert time.monotonic() < deadline, "the staged push was never published"
            publish_pending_weights(collector)
            time.sleep(0.01)
        next(batches)
        assert (next(batches)["probe_marker"] == 9.0).all()
    finally:
        collector.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_compile_policy_compiles_inside_each_worker_not_in_the_parent():
    import torch._dynamo.utils as dynamo_utils

    cfg = tiny_config()
    cfg.collector.compile_policy = True
    env = make_env(cfg.env, cfg.algo)
    models = build_models(cfg.algo, cfg.env, env, torch.device("cpu"))
    probe = TensorDictModule(DynamoProbe(), in_keys=["action"],
                             out_keys=["probe_pid", "probe_dynamo_frames", "probe_inherited"])
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


@pytest.mark.gpu_acceptance(WORKER_POLICY_DEVICE)
@pytest.mark.parametrize("algo", ["dreamer_v1", "dreamer_v3"])
@pytest.mark.parametrize("pixels", [False, True])
def test_what_workers_receive_holds_no_tensor_off_the_collector_device(algo, pixels):
    """A GPU learner's policy sent to CPU workers: every tensor the workers get is on
    the collector device, also the plain attributes nn.Module.to leaves behind (V1's
    TanhNormal bounds and exploration spec): else each worker opens a CUDA context
    and copies device-to-host at every step. ``meta`` stands in for the other device."""
    from dreamer.algos.registry import algorithm
    from dreamer.envs.factory import close_env
    from tests.support.configs import tiny_config as tiny_unit_config

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


# -- weight pushes never wait --------------------------------------------------------


class _NeverBlockingQueue(queue.Queue):
    """A worker's instruction or acknowledgement queue that fails a test if the learner waits on it."""

    def get(self, block=True, timeout=None):
        assert not block, "the learner waited for a worker"
        return super().get(block=False)


def _scheme_with_workers(shared: TensorDict, workers: int = 2, alive=lambda idx: True):
    from torchrl_ext import NonBlockingSharedMemWeightSyncScheme

    scheme = NonBlockingSharedMemWeightSyncScheme()
    scheme.shared_transport._unique_weights = [shared]  # what the workers read
    scheme._instruction_queues = {i: _NeverBlockingQueue() for i in range(workers)}
    scheme._ack_queues = {i: _NeverBlockingQueue() for i in range(workers)}
    scheme.is_alive = alive
    return scheme


def _instructions(scheme) -> list[int]:
    return [q.qsize() for q in scheme._instruction_queues.values()]


@pytest.mark.gpu_acceptance(WEIGHT_PUSH_NEVER_WAITS)
def test_a_weight_push_publishes_without_waiting_and_defers_while_workers_are_busy():
    """The first push publishes at once; a push before every worker acknowledged the
    previous one is staged, not waited for, and a later poll publishes the newest
    weights once the acknowledgements are in."""
    learner = nn.Linear(3, 2)
    shared = TensorDict.from_module(copy.deepcopy(learner)).data.clone()
    scheme = _scheme_with_workers(shared)

    scheme.send(weights=learner)
    assert (shared == TensorDict.from_module(learner).data).all() and _instructions(scheme) == [1, 1]
    with torch.no_grad():
        learner.weight.fill_(5.0)
    scheme.send(weights=learner)  # the workers have not acknowledged the first push yet
    assert (shared["weight"] != 5.0).all() and _instructions(scheme) == [1, 1]
    scheme._ack_queues[0].put("updated")
    assert not scheme.publish_ready()  # worker 1 still busy
    with torch.no_grad():
        learner.weight.fill_(7.0)  # weights staged from the host are read when published: the newest
    scheme._ack_queues[1].put("updated")
    assert scheme.publish_ready()
    assert (shared["weight"] == 7.0).all() and _instructions(scheme) == [2, 2]
    assert not scheme.publish_ready()  # nothing staged


@pytest.mark.gpu_acceptance(WEIGHT_PUSH_NEVER_WAITS)
def test_a_worker_dead_before_acknowledging_is_reported_not_waited_for():
    from torchrl_ext import ReceiverDied

    learner = nn.Linear(3, 2)
    alive = {0: True, 1: True}
    scheme = _scheme_with_workers(TensorDict.from_module(copy.deepcopy(learner)).data.clone(), alive=alive.get)
    scheme.send(weights=learner)
    scheme.send(weights=learner)
    alive[1] = False
    with pytest.raises(ReceiverDied, match="worker 1 died"):
        scheme.publish_ready()


@pytest.mark.gpu_acceptance(WEIGHT_PUSH_NEVER_WAITS)
def test_a_gpu_learners_push_copies_on_its_stream_and_publishes_after_the_event(monkeypatch):
    """GPU weights (CUDA stood in for): a non-blocking copy into page-locked staging on
    the learner's stream, an event after it; nothing published, nothing waited for,
    until the event has completed; then the staged copy is what the workers get."""
    from tests.support.fake_cuda import FakeCuda
    from torchrl_ext import weight_sync

    cuda = FakeCuda(monkeypatch)
    pinned, copies = [], []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t, *a, **k: pinned.append(t.shape) or t.clone())
    monkeypatch.setattr(weight_sync, "cuda_device_of", lambda weights: torch.device("cuda", 0))
    update_ = TensorDict.update_

    def spy_update_(td, source, *args, **kwargs):
        copies.append(kwargs.get("non_blocking", False))
        return update_(td, source, *args, **kwargs)

    monkeypatch.setattr(TensorDict, "update_", spy_update_)
    learner = nn.Linear(3, 2)
    shared = TensorDict.from_module(copy.deepcopy(learner)).data.clone()
    scheme = _scheme_with_workers(shared)
    with torch.no_grad():
        learner.weight.fill_(3.0)
    scheme.send(weights=learner)
    [(_, stream, event)] = cuda.events("record")
    assert stream == "default" and copies == [True] and len(pinned) == 2  # weight and bias staged once
    assert (shared["weight"] != 3.0).all() and _instructions(scheme) == [0, 0]
    with torch.no_grad():
        learner.weight.fill_(4.0)  # the next optimiser step: queued after the copy on the stream
    assert not scheme.publish_ready() and cuda.events("synchronize") == []
    event.done = True
    assert scheme.publish_ready()
    assert (shared["weight"] == 3.0).all() and _instructions(scheme) == [1, 1]


@pytest.mark.cuda(WEIGHT_PUSH_CUDA)
def test_a_gpu_learners_weight_push_never_syncs_and_delivers_the_weights_of_its_moment():
    learner = nn.Linear(3, 2).cuda()
    shared = TensorDict.from_module(copy.deepcopy(learner).cpu()).data.clone()
    scheme = _scheme_with_workers(shared)
    scheme.send(weights=learner)  # the first push allocates the page-locked staging
    deadline = time.monotonic() + 30
    while scheme._staged is not None:  # published once its copy is done
        assert time.monotonic() < deadline
        scheme.publish_ready()
    for ack in scheme._ack_queues.values():  # the workers took it
        ack.put("updated")
    with torch.no_grad():
        learner.weight.fill_(3.0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        scheme.send(weights=learner)
        with torch.no_grad():
            learner.weight.fill_(4.0)  # the next optimiser step, queued after the copy
        scheme.publish_ready()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    while scheme._staged is not None:
        assert time.monotonic() < deadline
        scheme.publish_ready()
    assert (shared["weight"] == 3.0).all()


EXITS_AFTER_COLLECTING = """
import sys, torch
sys.path.insert(0, {root!r})
from tests.data.test_collectors import tiny_config
from dreamer.algos.v1.models import build_models
from dreamer.data.collectors import make_collector
from dreamer.envs.factory import close_env, make_env

if __name__ == "__main__":
    cfg = tiny_config()
    env = make_env(cfg.env, cfg.algo)
    models = build_models(cfg.algo, cfg.env, env, torch.device("cpu"))
    close_env(env)
    for _ in range(2):  # as a benchmark builds them: several, one after another
        collector = make_collector(cfg.collector, cfg.env, cfg.algo, cfg.compile, models.policy(explore=True),
                                   seed=0, workers=1, random_frames=0, learner_threads=1)
        next(iter(collector))
        collector.shutdown()
    print("collected", flush=True)
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_script_that_collected_with_workers_exits_when_done(tmp_path):
    """Shut-down collectors leave nothing for interpreter exit to wait on: upstream left
    each weight sync scheme to ``__del__``, which at exit hung on a queue's feeder thread."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "collect_and_exit.py"
    script.write_text(EXITS_AFTER_COLLECTING.format(root=str(Path(__file__).resolve().parents[2])))
    try:
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"the script did not exit within 120 s; its output: {hung.stdout!r}")
    assert done.returncode == 0 and "collected" in done.stdout, done.stderr[-2000:]


def slow_weight_application() -> None:
    """A worker's ``worker_init``: applying pushed weights spends ~2 s in torch ops first (the
    GIL released), so a push still being applied when the worker exits is certain, not a race."""
    from torchrl.weight_update.weight_sync_schemes import WeightStrategy

    apply = WeightStrategy.apply_weights

    def slow(self, *args, **kwargs):
        work, deadline = torch.randn(600, 600), time.monotonic() + 2.0
        while time.monotonic() < deadline:
            work @ work
        return apply(self, *args, **kwargs)

    WeightStrategy.apply_weights = slow


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_worker_applying_a_push_when_the_run_ends_exits_cleanly():
    """The run's last weight push can reach a worker as it closes. Its receiver thread then
    finishes applying it before the worker's interpreter exits; a daemon thread inside a torch
    op at exit aborts the worker ("terminate called without an active exception", SIGABRT)."""
    cfg = tiny_config()
    cfg.compile.enabled = False
    env = make_env(cfg.env, cfg.algo)
    models = build_models(cfg.algo, cfg.env, env, torch.device("cpu"))
    close_env(env)
    collector = make_collector(
        cfg.collector, cfg.env, cfg.algo, cfg.compile, models.policy(explore=True), seed=0,
        workers=1, random_frames=0, learner_threads=1, worker_init=slow_weight_application,
    )
    try:
        next(iter(collector))
        collector.update_policy_weights_()
        assert collector.weight_push._staged is None  # published at once: no push was pending
        time.sleep(0.5)  # the worker's receiver polls every 0.1 s: it is now applying the push
    finally:
        collector.shutdown()
    assert collector.procs[0].exitcode == 0

"""dreamer/algos/update_paths.py on the CPU: the whole Dreamer V3 update (losses,
backward, optimiser steps with their non-finite skip, slow critic, metrics) is
one torch.compile graph with no host read, and gives the losses path's numbers;
the losses path's compiled losses trace without graph breaks or recompiles; the
update path a config asks for is one the device can run."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch._dynamo.utils import counters

from dreamer.algos import update_paths
from dreamer.algos.update_paths import UpdatePath, make_update_path, resolve_update_path
from dreamer.envs.factory import close_env, make_env
from dreamer.errors import UserError
from tests.algos.update_helpers import (
    assert_same_state,
    assert_same_state_dicts,
    collected_batch,
    v3_config,
    v3_learner,
)
from tests.support.configs import tiny_config
from tests.support.learners import new_learner
from tests.support.spies import HOST_TRANSFERS, CallCounter, spy_tensor_methods

CPU = torch.device("cpu")
# (discrete actions, pixels). Each task costs a whole-update trace: the discrete actor on
# pixels (its one-hot sample, the image encoder and decoder) here; the continuous actor from
# states is traced by tests/system/test_distributed_whole_update.py, on two ranks.
TASKS = {"discrete-pixels": (True, True)}
UPDATES = 3

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread


class GraphRecorder:
    """A torch.compile backend that keeps every graph dynamo hands it and runs it as traced."""

    def __init__(self):
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, graph: torch.fx.GraphModule, example_inputs):
        self.graphs.append(graph)
        return graph.forward

    def host_reads(self) -> list[str]:
        """Nodes that would copy a tensor's value to the host."""
        reads = []
        for graph in self.graphs:
            for node in graph.graph.nodes:
                name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
                if name in HOST_TRANSFERS or "_local_scalar_dense" in str(node.target):
                    reads.append(f"{node.op} {node.target}")
        return reads


@pytest.fixture(scope="module", params=list(TASKS))
def learners(request):
    """(losses_path learner, whole learner compiled and warmed up, graph recorder, batch, env):
    the same initial state; the whole update compiled once per task."""
    discrete, pixels = TASKS[request.param]
    losses_cfg = v3_config(discrete=discrete, pixels=pixels)
    whole_cfg = v3_config(discrete=discrete, pixels=pixels, update="whole", compiled=True)
    env = make_env(losses_cfg.env, losses_cfg.algo, seed=0)
    recorder = GraphRecorder()
    try:
        batch = collected_batch(losses_cfg, env)
        losses_path, whole = v3_learner(losses_cfg, env), v3_learner(whole_cfg, env)
        torch._dynamo.reset()
        counters.clear()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(
                update_paths, "whole_update_compile_kwargs", lambda cc: {"backend": recorder, "fullgraph": True}
            )
            whole.compile()
            rng = torch.get_rng_state()
            assert whole.warmup(batch.clone()) > 0
            assert torch.equal(torch.get_rng_state(), rng), "warm-up moved the RNG stream"
            weights = losses_path.models.modules.state_dict()
            assert all(torch.equal(v, weights[k]) for k, v in whole.models.modules.state_dict().items())
            assert_same_state_dicts(whole.actor_loss.retnorm.state_dict(), losses_path.actor_loss.retnorm.state_dict())
            yield losses_path, whole, recorder, batch, env
    finally:
        close_env(env)


@pytest.mark.slow
@pytest.mark.trace
def test_whole_update_is_one_graph_without_host_reads_and_gives_the_losses_paths_numbers(learners, monkeypatch):
    losses_path, whole, recorder, batch, _ = learners
    assert losses_path.update_path is UpdatePath.LOSSES and whole.update_path is UpdatePath.WHOLE
    assert len(recorder.graphs) == 1 and not counters["graph_break"], dict(counters["graph_break"])
    assert recorder.host_reads() == []
    calls = CallCounter()
    with torch._dynamo.config.patch(error_on_recompile=True):  # warm: no trace from here on
        spy_tensor_methods(monkeypatch, HOST_TRANSFERS, calls)
        torch.manual_seed(7)
        for _ in range(UPDATES):
            whole.update(batch.clone())
        monkeypatch.undo()
    assert calls.total() == 0, f"host transfers in the compiled update: {calls.report()}"
    assert len(recorder.graphs) == 1
    imagination = whole.models.model_based_env
    assert not imagination.__dict__.get("_cache"), f"the update filled TorchRL's key cache: {imagination._cache}"
    torch.manual_seed(7)
    for _ in range(UPDATES):
        losses_path.update(batch.clone())
    assert_same_state(whole, losses_path)
    theirs, ours = losses_path.flush_metrics(), whole.flush_metrics()
    assert set(ours) == set(theirs) and all(math.isfinite(v) for v in ours.values())
    for name in theirs:
        assert ours[name] == pytest.approx(theirs[name], rel=1e-5, abs=1e-6), name


@pytest.mark.slow
@pytest.mark.trace
def test_whole_update_skips_a_non_finite_batch_and_checkpoints_into_and_out_of_the_whole_path(learners):
    losses_path, whole, recorder, batch, env = learners
    whole.load_state_dict(copy.deepcopy(losses_path.state_dict()))  # into the whole path
    losses_path.flush_metrics(), whole.flush_metrics()
    before = {k: v.clone() for k, v in whole.models.modules.state_dict().items()}
    poisoned = batch.clone()
    poisoned["next", "reward"][0] = float("nan")  # NaN loss -> NaN gradients
    torch.manual_seed(9)
    with torch._dynamo.config.patch(error_on_recompile=True):
        whole.update(poisoned.clone())
    after = whole.models.modules.state_dict()
    world_model = [k for k in before if k.split(".")[0] in ("encoder", "decoder", "prior", "posterior", "reward")]
    assert all(torch.equal(after[k], before[k]) for k in world_model), "a non-finite world-model step was taken"
    torch.manual_seed(9)
    losses_path.update(poisoned.clone())
    assert_same_state(whole, losses_path)
    skipped = "updates_skipped_nonfinite"
    assert whole.flush_metrics()[skipped] == 1 == losses_path.flush_metrics()[skipped]

    resumed = v3_learner(v3_config(discrete=losses_path.models.discrete, pixels=losses_path.obs_key == "pixels"), env)
    resumed.load_state_dict(copy.deepcopy(whole.state_dict()))  # out of the whole path
    for learner in (resumed, whole):
        torch.manual_seed(11)
        learner.update(batch.clone())
    assert_same_state(resumed, whole)
    assert len(recorder.graphs) == 1  # loading a checkpoint traced nothing again


def test_captured_updates_need_cuda_and_whole_updates_need_compile():
    with pytest.raises(UserError, match="compile.update=captured .* on cpu"):
        resolve_update_path(v3_config(update="captured").compile, CPU)
    with pytest.raises(UserError, match="compile.update=whole .* compile.enabled=false"):
        v3_config(update="whole", compiled=False)


def test_auto_captures_the_eager_update_on_cuda_and_compiles_the_losses_on_the_cpu():
    """By measurement (docs/PERFORMANCE.md): on CUDA the captured eager body (its compiled
    body has not yet run on a GPU), on the CPU the compiled losses."""
    cfg = v3_config(update="auto", compiled=True)
    assert resolve_update_path(cfg.compile, CPU) is UpdatePath.LOSSES
    assert resolve_update_path(cfg.compile, torch.device("cuda")) is UpdatePath.CAPTURED
    env = make_env(cfg.env, cfg.algo, seed=0)
    try:
        learner = v3_learner(cfg, env)
    finally:
        close_env(env)
    on_cuda = make_update_path(learner, cfg.compile, torch.device("cuda"))  # built, not run: no CUDA needed
    assert on_cuda.path is UpdatePath.CAPTURED and not on_cuda.compile_cfg.enabled
    assert learner.update_path is UpdatePath.LOSSES and learner.compile_cfg.enabled


def test_the_old_name_of_the_compiled_losses_path_is_refused_naming_the_new_one():
    from dreamer.config import load_config

    with pytest.raises(UserError) as err:
        load_config({"compile": {"update": "card"}})
    assert str(err.value) == "compile.update=card was renamed: use compile.update=losses"


def test_dreamer_v1_refuses_a_compiled_whole_update_in_one_line():
    cfg = tiny_config()
    cfg.compile.enabled, cfg.compile.update = True, "whole"
    env = make_env(cfg.env, cfg.algo, seed=0)
    try:
        with pytest.raises(UserError, match="dreamer_v1's cannot be one graph .*Adam.step.*compile.update=losses"):
            new_learner(cfg, env)
    finally:
        close_env(env)


@pytest.mark.slow
@pytest.mark.trace
def test_losses_path_compiled_losses_of_a_discrete_actor_run_without_graph_breaks_or_recompiles_after_warm_up():
    """A discrete actor's one-hot sample broke the compiled imagination (its frame ran
    eagerly, and the tensordict calls inside it, compiled one by one, recompiled per
    key up to dynamo's limit). A continuous actor's: tests/algos/test_learner_v3.py."""
    cfg = v3_config(discrete=True, compiled=True)
    env = make_env(cfg.env, cfg.algo, seed=0)
    try:
        batch = collected_batch(cfg, env)
        learner = v3_learner(cfg, env)
    finally:
        close_env(env)
    learner.compile()
    torch._dynamo.reset()
    counters.clear()
    learner.warmup(batch.clone())
    assert counters["stats"]["unique_graphs"] > 0
    assert not counters["graph_break"], dict(counters["graph_break"])
    graphs = counters["stats"]["unique_graphs"]
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(2):
            learner.update(batch.clone())
    assert counters["stats"]["unique_graphs"] == graphs
    assert not counters["graph_break"], dict(counters["graph_break"])

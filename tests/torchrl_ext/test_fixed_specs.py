"""torchrl_ext/fixed_specs.py: the imagination envs answer their keys and done flags
from values fixed at build, equal to upstream's, and a traced reset and imagined
rollout write nothing on the env (TorchRL's key cache stays empty)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torch._dynamo.utils import counters
from torchrl.data import Composite, Unbounded
from torchrl.envs import EnvBase
from torchrl.envs.utils import ExplorationType, set_exploration_type

from dreamer.envs.factory import close_env, make_env
from tests.support.configs import tiny_config
from torchrl_ext.fixed_specs import CACHED_PROPERTIES

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

ALGOS = ("dreamer_v1", "dreamer_v3")
BATCH, HORIZON = 5, 4


def _models(algo: str):
    if algo == "dreamer_v1":
        from dreamer.algos.v1.models import build_models
    else:
        from dreamer.algos.v3.models import build_models
    cfg = tiny_config(algo=algo)
    env = make_env(cfg.env, cfg.algo, seed=0)
    try:
        torch.manual_seed(0)
        return build_models(cfg.algo, cfg.env, env, torch.device("cpu"))
    finally:
        close_env(env)


@pytest.fixture(params=ALGOS)
def models(request):
    return _models(request.param)


def _start(env) -> TensorDict:
    """Replayed latents, as the actor losses hand them to ``reset``: no done key."""
    g = torch.Generator().manual_seed(1)
    return TensorDict({"state": torch.randn(BATCH, *env.prior_shape, generator=g),
                       "belief": torch.randn(BATCH, *env.belief_shape, generator=g)}, batch_size=[BATCH])


def test_fixed_keys_and_templates_are_upstreams(models):
    env = models.model_based_env
    assert not env.__dict__.get("_cache")
    fixed = {name: getattr(env, name) for name in CACHED_PROPERTIES}
    assert not env.__dict__.get("_cache"), "a fixed value was computed again"
    for name in CACHED_PROPERTIES:
        upstream = getattr(EnvBase, name).fget(env)
        if name == "_step_mdp":
            assert type(fixed[name]) is type(upstream)
        else:
            assert fixed[name] == upstream, name
    assert set(env.done_templates) == set(env.done_keys)
    for key, zero in env.done_templates.items():
        assert torch.equal(zero, env.full_done_spec[key].zero()), key


def test_reset_of_a_start_is_upstreams_and_fills_no_cache(models):
    env = models.model_based_env
    ours = env.reset(_start(env))
    assert not env.__dict__.get("_cache")
    theirs = EnvBase.reset(env, _start(env))
    assert set(ours.keys(True, True)) == set(theirs.keys(True, True)) > {"state", "belief", "done"}
    for key in theirs.keys(True, True):
        mine, upstream = ours.get(key), theirs.get(key)
        assert mine.dtype == upstream.dtype and mine.shape == upstream.shape and torch.equal(mine, upstream), key


@pytest.mark.trace
@pytest.mark.parametrize("algo", ALGOS)
def test_a_traced_reset_and_imagined_rollout_write_nothing_on_the_env_and_trace_once(algo):
    """What the actor losses run inside the compiled update, on every supported torch (torch
    2.11's dynamo cannot trace the ``__dict__.setdefault`` that fills TorchRL's cache, and a
    trace that filled it was traced again). V3's batched rollout is one graph; V1 runs
    upstream's rollout, whose device moves break the graph (its actor loss compiles without
    fullgraph)."""
    models = _models(algo)
    env = models.model_based_env
    fullgraph = algo == "dreamer_v3"

    def imagine(start):
        with set_exploration_type(ExplorationType.RANDOM):
            started = env.reset(start.copy())
            return env.rollout(HORIZON, policy=models.actor, auto_reset=False, tensordict=started,
                               break_when_any_done=False)

    torch.manual_seed(2)
    eager = imagine(_start(env))
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(imagine, backend="eager", fullgraph=fullgraph)
    torch.manual_seed(2)
    traced = compiled(_start(env))
    assert not env.__dict__.get("_cache"), env.__dict__["_cache"]
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled(_start(env))
    assert traced.batch_size == eager.batch_size == (BATCH, HORIZON)
    for key in eager.keys(True, True):
        assert torch.equal(traced.get(key), eager.get(key)), key


def test_a_spec_set_after_build_fixes_the_values_again():
    env = _models("dreamer_v3").model_based_env
    observations = env.observation_spec.clone()
    observations["extra"] = Unbounded(shape=(*observations.shape, 2))
    env.observation_spec = observations
    assert "extra" in env.observation_keys
    done = env.full_done_spec
    env.full_done_spec = Composite(done=done["done"].clone(), terminated=done["terminated"].clone(), shape=done.shape)
    assert env.done_keys == ["done", "terminated"] and list(env.done_templates) == ["done", "terminated"]
    started = env.reset(_start(env))
    assert set(started.keys()) == {"state", "belief", "done", "terminated"}
    assert not env.__dict__.get("_cache")

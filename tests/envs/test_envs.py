"""dreamer/envs/factory.py: one env contract across gymnasium, dm_control and Atari."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid

import gymnasium
import pytest
import torch
from torchrl.data import OneHot

from dreamer.config import EnvConfig, load_config
from dreamer.envs.factory import close_env, is_discrete, make_env
from dreamer.envs.keys import PIXELS_KEY, VECTOR_KEY, observation_key
from dreamer.errors import UserError
from tests.support.custom_env import write_custom_env_module
from tests.support.paths import REPO_ROOT

STATE_DIM, BELIEF_DIM = 3, 5
# The algo sections that size the policy's carry ("state", "belief") in every env.
ALGO = load_config({"algo": {"name": "dreamer_v1", "state_dim": STATE_DIM, "rssm_hidden_dim": BELIEF_DIM}}).algo
TINY_ALGO = load_config({"algo": {"name": "dreamer_v1", "state_dim": 1, "rssm_hidden_dim": 1}}).algo


@pytest.fixture
def env_of():
    envs = []

    def make(**kw):
        env = make_env(EnvConfig(**kw), ALGO, seed=0)
        envs.append(env)
        return env

    yield make
    for env in envs:
        close_env(env)


def _check_common_contract(rollout, steps):
    assert rollout.shape == (steps,)
    # The recurrent policy's carry starts at zero.
    assert torch.equal(rollout["state"][0], torch.zeros(STATE_DIM))
    assert torch.equal(rollout["belief"][0], torch.zeros(BELIEF_DIM))
    # Running return for evaluation.
    torch.testing.assert_close(
        rollout["next", "episode_reward"][-1].to(torch.float64),
        rollout["next", "reward"].sum(0).to(torch.float64),
        rtol=1e-5,
        atol=1e-5,
    )
    assert rollout["next", "step_count"][-1].item() == steps


@pytest.mark.parametrize("algo", ["dreamer_v1", "dreamer_v3"])
def test_the_env_carry_is_sized_from_the_algo_section(algo):
    """Every caller passes the algo section; the env derives the carry sizes itself:
    V1's Gaussian state_dim, V3's num_categoricals x num_classes one-hots."""
    sizes = {"state_dim": 7} if algo == "dreamer_v1" else {"num_categoricals": 4, "num_classes": 6, "gru_blocks": 2}
    a = load_config({"algo": {"name": algo, "rssm_hidden_dim": 16, **sizes}}).algo
    env = make_env(EnvConfig(name="Pendulum-v1"), a, seed=0)
    try:
        td = env.reset()
        expected_state = 7 if algo == "dreamer_v1" else 4 * 6
        assert td["state"].shape == (expected_state,) and td["belief"].shape == (16,)
    finally:
        close_env(env)


def test_gymnasium_state_env(env_of):
    env = env_of(backend="gymnasium", name="Pendulum-v1")
    td = env.rollout(4)
    obs = td[VECTOR_KEY]
    assert obs.dtype == torch.float32
    assert obs.shape == (4, 3)
    assert PIXELS_KEY not in td.keys()
    assert env.observation_spec[VECTOR_KEY].dtype == torch.float32
    _check_common_contract(td, 4)


def test_gymnasium_pixels_env(env_of):
    env = env_of(backend="gymnasium", name="Pendulum-v1", from_pixels=True, render_size=64)
    td = env.rollout(3)
    assert td[PIXELS_KEY].dtype == torch.uint8
    assert td[PIXELS_KEY].shape == (3, 64, 64, 3)
    assert td["next", PIXELS_KEY].shape == (3, 64, 64, 3)
    assert VECTOR_KEY not in td.keys()
    spec = env.observation_spec[PIXELS_KEY]
    assert spec.shape == (64, 64, 3) and spec.dtype == torch.uint8
    assert td[PIXELS_KEY].float().std() > 0  # an actual rendering, not a blank frame
    _check_common_contract(td, 3)


def test_record_pixels_adds_frames_to_a_state_env():
    env = make_env(EnvConfig(name="Pendulum-v1"), TINY_ALGO, record_pixels=True)
    try:
        td = env.rollout(2)
        assert td[VECTOR_KEY].shape == (2, 3)
        assert td[PIXELS_KEY].shape == (2, 64, 64, 3) and td[PIXELS_KEY].dtype == torch.uint8
    finally:
        close_env(env)


@pytest.mark.mujoco
def test_dm_control_pixels_env(env_of):
    env = env_of(backend="dm_control", name="cartpole-balance", from_pixels=True, render_size=64)
    td = env.rollout(3)
    assert td[PIXELS_KEY].dtype == torch.uint8
    assert td[PIXELS_KEY].shape == (3, 64, 64, 3)
    assert td[PIXELS_KEY].float().std() > 0
    _check_common_contract(td, 3)


@pytest.mark.mujoco
def test_dm_control_state_env_is_one_float32_vector(env_of):
    env = env_of(backend="dm_control", name="cartpole-balance", from_pixels=False)
    td = env.rollout(3)
    obs = td[VECTOR_KEY]
    assert obs.dtype == torch.float32
    assert obs.shape == (3, 5)  # cartpole: 3 positions + 2 velocities, concatenated
    assert PIXELS_KEY not in td.keys()
    assert td["action"].dtype == torch.float32
    _check_common_contract(td, 3)


@pytest.mark.mujoco
def test_dm_control_env_is_single_precision(env_of):
    # The world model, the actor and the replay buffer are float32: actions the
    # env takes and rewards it returns must be too (dm_control's are float64).
    env = env_of(backend="dm_control", name="cartpole-balance", from_pixels=True)
    td = env.rollout(2)
    assert td["action"].dtype == torch.float32
    assert td["next", "reward"].dtype == torch.float32
    assert env.action_spec.dtype == torch.float32
    assert env.full_reward_spec["reward"].dtype == torch.float32


def test_atari_pong_pixels_one_hot_actions(env_of):
    env = env_of(backend="atari", name="Pong", from_pixels=True, action_repeat=4)
    assert is_discrete(env)
    assert isinstance(env.action_spec, OneHot)
    n = env.action_spec.shape[-1]
    assert n == 6  # Pong's minimal action set (full_action_space=False)
    td = env.rollout(3)
    assert td[PIXELS_KEY].dtype == torch.uint8
    assert td[PIXELS_KEY].shape == (3, 64, 64, 3)
    assert td["action"].shape == (3, n)
    assert torch.equal(td["action"].sum(-1), torch.ones(3, dtype=td["action"].dtype))
    _check_common_contract(td, 3)


def test_atari_observation_key_is_pixels_even_if_not_asked():
    assert observation_key(EnvConfig(backend="atari", name="Pong")) == PIXELS_KEY
    assert observation_key(EnvConfig(backend="gymnasium")) == VECTOR_KEY
    assert observation_key(EnvConfig(backend="dm_control", from_pixels=True)) == PIXELS_KEY


def _listed(msg: str) -> list[str]:
    return [name.strip() for name in msg.split("available:", 1)[1].split(",")]


@pytest.mark.parametrize(
    "backend, bad, known",
    [
        ("gymnasium", "Pendulum-v9", "Pendulum-v1"),
        ("dm_control", "cartpole-balanse", "cartpole-balance"),
        ("atari", "Pongg", "Pong"),
    ],
)
def test_unknown_env_name_lists_valid_names(backend, bad, known):
    cfg = EnvConfig(backend=backend, name=bad, from_pixels=True)
    with pytest.raises(UserError) as err:
        make_env(cfg, TINY_ALGO)
    msg = str(err.value)
    assert re.search(re.escape(repr(bad)), msg)
    assert "available" in msg
    # The names listed are what env.name accepts.
    assert known in _listed(msg), f"{known!r} not among the listed names: {msg[:300]}..."


@pytest.mark.parametrize("backend", [pytest.param("dm_control", marks=pytest.mark.mujoco), "atari"])
def test_listed_names_are_accepted(backend):
    with pytest.raises(UserError) as err:
        make_env(EnvConfig(backend=backend, name="no-such-env", from_pixels=True), TINY_ALGO)
    name = _listed(str(err.value))[0]
    env = make_env(EnvConfig(backend=backend, name=name, from_pixels=True), TINY_ALGO)
    try:
        assert env.rollout(1)[PIXELS_KEY].dtype == torch.uint8
    finally:
        close_env(env)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.mujoco
def test_a_dm_control_env_closed_unused_leaves_no_garbage_that_hangs_the_process():
    # A dm_control pixel env built and closed unused (the run's proof env is: dreamer/run/build.py does
    # this in the learner process), and the evaluation's batch of them, unused and used. Collecting
    # that garbage later -- which Python's cyclic GC will do at some point of a run -- must not deadlock.
    # A subprocess with a timeout, so a hang fails this test instead of the suite.
    code = (
        "import gc\n"
        "from dreamer.config import EnvConfig, load_config\n"
        "from dreamer.envs.factory import close_env, make_env\n"
        "from dreamer.envs.factory import make_eval_env\n"
        "cfg = EnvConfig(backend='dm_control', name='cartpole-balance', from_pixels=True)\n"
        "close_env(make_env(cfg, load_config({}).algo))\n"
        "close_env(make_eval_env(cfg, load_config({}).algo, episodes=2, seed=0))\n"  # never started
        "evaluation = make_eval_env(cfg, load_config({}).algo, episodes=2, seed=0)\n"
        "evaluation.rollout(2)\n"  # started: two envs, two render contexts
        "close_env(evaluation)\n"
        "gc.collect()\n"
        "print('collected', flush=True)\n"
    )
    env = dict(os.environ)  # the backend the session picked (tests/conftest.py), as a run's probe would
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=90,
            cwd=REPO_ROOT,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("gc.collect() after closing a dm_control env hung (render context __del__ deadlock)")
    assert "collected" in proc.stdout, proc.stderr[-2000:]


def test_episode_limit_truncates(env_of):
    env = env_of(backend="gymnasium", name="Pendulum-v1", max_episode_steps=5)
    td = env.rollout(20)  # stops at the first done
    assert td.shape == (5,)
    assert td["next", "truncated"][-1].item()
    assert td["next", "done"][-1].item()
    assert not td["next", "terminated"][-1].item()
    assert not td["next", "done"][:-1].any()


def test_episode_limit_resets_to_a_new_episode(env_of):
    env = env_of(backend="gymnasium", name="Pendulum-v1", max_episode_steps=3)
    td = env.rollout(7, break_when_any_done=False)
    assert td["step_count"].squeeze(-1).tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert td["next", "truncated"].squeeze(-1).tolist() == [False, False, True] * 2 + [False]
    # The carry is zeroed at each reset.
    assert torch.equal(td["belief"][3], torch.zeros(BELIEF_DIM))


def test_action_repeat_multiplies_env_frames(env_of):
    # Pendulum's own limit is 200 env steps: with action repeat 4 that is 50 agent steps.
    env = env_of(backend="gymnasium", name="Pendulum-v1", action_repeat=4, max_episode_steps=1000)
    td = env.rollout(80)
    assert td.shape == (50,)
    assert td["next", "truncated"][-1].item()


# -- env.import: the user's own gymnasium ids ------------------------------------


@pytest.fixture
def custom_env_module(tmp_path, monkeypatch):
    """(module, env_id) of a fresh module in tmp_path registering a new id, on sys.path."""
    tag = uuid.uuid4().hex[:8]
    module, env_id = f"user_envs_{tag}", f"Drift{tag}-v0"
    write_custom_env_module(tmp_path, module, env_id)
    monkeypatch.syspath_prepend(str(tmp_path))
    return module, env_id


def test_env_import_registers_the_users_env_before_it_is_looked_up(custom_env_module):
    module, env_id = custom_env_module
    assert env_id not in gymnasium.registry  # nothing registered it yet: env.import must
    cfg = EnvConfig(backend="gymnasium", name=env_id, import_=module, action_repeat=1)
    env = make_env(cfg, ALGO, seed=0)
    try:
        td = env.rollout(5)
        assert td[VECTOR_KEY].shape == (5, 2) and td[VECTOR_KEY].dtype == torch.float32
        assert torch.all(td["next", VECTOR_KEY][:, 1] == 1.0)  # the module's own dynamics
        _check_common_contract(td, 5)
    finally:
        close_env(env)


def test_env_import_of_a_missing_module_is_one_line_naming_module_and_key():
    cfg = EnvConfig(backend="gymnasium", name="Whatever-v0", import_="no_such_pkg.envs")
    with pytest.raises(UserError) as err:
        make_env(cfg, TINY_ALGO)
    msg = str(err.value)
    assert msg.startswith("env.import=no_such_pkg.envs: cannot import it") and "PYTHONPATH" in msg
    assert "\n" not in msg


def test_env_import_that_does_not_register_the_name_says_so(custom_env_module):
    module, env_id = custom_env_module
    cfg = EnvConfig(backend="gymnasium", name="Typo" + env_id, import_=module)
    with pytest.raises(UserError) as err:
        make_env(cfg, TINY_ALGO)
    msg = str(err.value)
    assert f"env.import={module} did not register it" in msg
    assert env_id in _listed(msg)  # what it did register is offered


# -- Atari no-op starts ----------------------------------------------------------


def _episode_start_frames(env, resets: int) -> list[int]:
    """ALE's frame counter right after each reset: the no-op frames that passed."""
    ale = env.base_env._env.unwrapped.ale
    starts = []
    for _ in range(resets):
        env.reset()
        starts.append(ale.getEpisodeFrameNumber())
    return starts


def test_atari_noop_starts_skip_a_seeded_random_number_of_frames(env_of):
    cfg = dict(backend="atari", name="Pong", from_pixels=True, action_repeat=4, sticky_action_prob=0.0)
    starts = _episode_start_frames(env_of(**cfg, noop_max=30), 12)
    assert all(0 <= n <= 30 for n in starts) and len(set(starts)) > 3, starts
    assert _episode_start_frames(env_of(**cfg, noop_max=30), 12) == starts  # same seed, same starts
    assert _episode_start_frames(env_of(**cfg, noop_max=0), 3) == [0, 0, 0]


# -- action repeat on pixel envs: one render per agent step -----------------------


def _reference_pixel_env(backend: str, name: str, repeat: int):
    """TorchRL's own frame_skip path, which renders on every repeated step."""
    if backend == "dm_control":
        from dm_control import suite
        from torchrl.envs import DMControlWrapper

        domain, task = name.split("-", 1)
        return DMControlWrapper(suite.load(domain, task), from_pixels=True, pixels_only=True,
                                frame_skip=repeat, render_kwargs={"height": 64, "width": 64})
    from torchrl.envs import GymEnv

    return GymEnv(name, from_pixels=True, pixels_only=True, frame_skip=repeat)


def _count_renders(monkeypatch, backend: str) -> list[int]:
    if backend == "dm_control":
        from dm_control.mujoco import Physics as owner
    else:
        from gymnasium.envs.classic_control.pendulum import PendulumEnv as owner
    calls = [0]
    render = owner.render

    def counted(self, *args, **kwargs):
        calls[0] += 1
        return render(self, *args, **kwargs)

    monkeypatch.setattr(owner, "render", counted)
    return calls


def _roll_fixed_actions(env, actions):
    td, steps = env.reset(), []
    for action in actions:
        td["action"] = action
        nxt = env.step(td)["next"]
        steps.append(nxt.select("pixels", "reward", "done", "terminated", "truncated").clone())
        td = env.reset() if nxt["done"].any() else nxt
    return steps


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend, name, repeat, steps, cut_repeats", [
    pytest.param("dm_control", "cartpole-swingup", 2, 6, 0, marks=pytest.mark.mujoco),
    # Pendulum ends after 200 frames: with repeat 3 its 67th agent step stops after 2 of 3
    # repeats (a truncation mid-repeat), twice in 140 steps.
    ("gymnasium", "Pendulum-v1", 3, 140, 2),
])
def test_pixel_action_repeat_renders_once_per_agent_step_with_frame_skips_results(
    env_of, monkeypatch, backend, name, repeat, steps, cut_repeats
):
    ours = env_of(backend=backend, name=name, from_pixels=True, render_size=64,
                  action_repeat=repeat, max_episode_steps=10_000)
    reference = _reference_pixel_env(backend, name, repeat)
    reference.set_seed(0)
    torch.manual_seed(0)
    actions = [ours.action_spec.rand() for _ in range(steps)]
    try:
        renders = _count_renders(monkeypatch, backend)
        got = _roll_fixed_actions(ours, actions)
        ours_renders, renders[0] = renders[0], 0
        expected = _roll_fixed_actions(reference, actions)
        reference_renders = renders[0]
    finally:
        close_env(reference)
    ends = [s["done"].item() for s in got]
    assert ends == [s["done"].item() for s in expected]
    assert sum(ends) == cut_repeats
    resets = 1 + sum(ends)
    assert ours_renders == steps + resets  # one frame per agent step
    assert reference_renders == repeat * steps - cut_repeats + resets  # one per repeated step
    for mine, theirs in zip(got, expected):
        frame = theirs["pixels"]
        if frame.shape != mine["pixels"].shape:  # gymnasium draws 500x500; we store 64x64
            from dreamer.envs.wrappers import DownsampleUInt8

            frame = DownsampleUInt8(64)._apply_transform(frame)
        assert torch.equal(mine["pixels"], frame)
        torch.testing.assert_close(mine["reward"].double(), theirs["reward"].double())
        assert torch.equal(mine["truncated"], theirs["truncated"])

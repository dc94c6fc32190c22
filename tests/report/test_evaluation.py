"""dreamer/report/evaluation.py: the evaluation's episodes, stepped as one batch, score as if run one by one."""

from __future__ import annotations

import torch
from tensordict.nn import TensorDictModule

from dreamer.config import EnvConfig, load_config
from dreamer.envs import factory
from dreamer.envs.factory import close_env, make_env, make_eval_env
from dreamer.envs.keys import PIXELS_KEY, VECTOR_KEY
from dreamer.report.evaluation import evaluate

ALGO = load_config({"algo": {"name": "dreamer_v1", "state_dim": 2, "rssm_hidden_dim": 3}}).algo
# CartPole ends an episode when the pole falls: episodes of different lengths,
# so some envs of the batch finish while others still run.
CARTPOLE = EnvConfig(name="CartPole-v1", max_episode_steps=60)


def lean_policy() -> TensorDictModule:
    """Pushes toward the pole's lean, blind to its speed (a poor controller): episodes of ~20-60 steps."""
    def act(observation):
        push_right = observation[..., 2] > 0
        return torch.nn.functional.one_hot(push_right.long(), 2).float()
    return TensorDictModule(act, in_keys=[VECTOR_KEY], out_keys=["action"])


def one_by_one(env_cfg: EnvConfig, seeds: range, policy) -> list[tuple[float, int]]:
    """(return, length) of each seed's first episode, each on its own env."""
    results = []
    for seed in seeds:
        env = make_env(env_cfg, ALGO, seed=seed)
        try:
            rollout = env.rollout(env_cfg.max_episode_steps, policy)
            results.append((float(rollout["next", "episode_reward"][-1]), rollout.shape[0]))
        finally:
            close_env(env)
    return results


def test_batched_episodes_score_what_each_episode_scores_alone():
    policy = lean_policy()
    expected = one_by_one(CARTPOLE, range(100, 104), policy)
    lengths = {length for _, length in expected}
    assert len(lengths) > 1, "the seeds must give episodes of different lengths for this test to mean anything"
    env = make_eval_env(CARTPOLE, ALGO, episodes=4, seed=100)
    try:
        first = evaluate(env, policy, episodes=4, max_steps=CARTPOLE.max_episode_steps, record=False)
        assert first.returns == [r for r, _ in expected]
        # The next evaluation plays new episodes (each env continues its own random stream).
        second = evaluate(env, policy, episodes=4, max_steps=CARTPOLE.max_episode_steps, record=False)
        assert len(second.returns) == 4 and second.returns != first.returns
    finally:
        close_env(env)


def test_more_episodes_than_envs_take_more_rollouts(monkeypatch):
    monkeypatch.setattr(factory, "EVAL_ENVS_MAX", 2)
    policy = lean_policy()
    assert make_eval_env(CARTPOLE, ALGO, episodes=3, seed=0).batch_size == (2,)
    monkeypatch.setattr(factory, "EVAL_ENVS_MAX", 4)
    assert make_eval_env(CARTPOLE, ALGO, episodes=5, seed=0).batch_size == (3,)  # 3 + 2, not 4 + 4
    monkeypatch.setattr(factory, "EVAL_ENVS_MAX", 2)
    env = make_eval_env(CARTPOLE, ALGO, episodes=5, seed=100)
    try:
        assert env.batch_size == (2,)
        result = evaluate(env, policy, episodes=5, max_steps=CARTPOLE.max_episode_steps, record=False)
    finally:
        close_env(env)
    assert len(result.returns) == 5
    assert result.returns[:2] == [r for r, _ in one_by_one(CARTPOLE, range(100, 102), policy)]


def test_the_video_is_the_first_episode_to_its_end():
    policy = lean_policy()
    [(_, length)] = one_by_one(CARTPOLE, range(7, 8), policy)
    env = make_eval_env(CARTPOLE, ALGO, episodes=3, seed=7, record_pixels=True)
    try:
        result = evaluate(env, policy, episodes=3, max_steps=CARTPOLE.max_episode_steps, record=True)
    finally:
        close_env(env)
    assert result.frames is not None and result.frames.dtype == torch.uint8
    assert result.frames.shape == (length, 64, 64, 3)
    assert result.frames[-1].float().std() > 0  # a rendered frame, not the padding of a finished env


def test_a_recurrent_policy_carries_its_belief_per_env():
    """The acting policy's carry ("belief") is per env: the batched returns equal the one-by-one ones
    for a policy whose action depends on the carried belief."""
    def act(observation, belief):
        next_belief = 0.5 * belief + observation[..., 2:3].expand_as(belief)  # the lean, smoothed
        push_right = next_belief[..., 0] > 0
        return torch.nn.functional.one_hot(push_right.long(), 2).float(), next_belief
    policy = TensorDictModule(act, in_keys=[VECTOR_KEY, "belief"], out_keys=["action", ("next", "belief")])
    expected = one_by_one(CARTPOLE, range(30, 33), policy)
    env = make_eval_env(CARTPOLE, ALGO, episodes=3, seed=30)
    try:
        result = evaluate(env, policy, episodes=3, max_steps=CARTPOLE.max_episode_steps, record=False)
    finally:
        close_env(env)
    assert result.returns == [r for r, _ in expected]
    assert PIXELS_KEY not in env.observation_spec.keys()

"""dreamer/report/episodes.py: the returns of the episodes collection finished, logged while training."""

from __future__ import annotations

import pytest
import torch
from torchrl.collectors import Collector

from dreamer.config import EnvConfig, load_config
from dreamer.envs.factory import close_env, make_env
from dreamer.report.episodes import CollectedEpisodes

ALGO = load_config({"algo": {"name": "dreamer_v1", "state_dim": 2, "rssm_hidden_dim": 3}}).algo
# 30-step episodes against 25-step batches: every episode spans two batches.
PENDULUM = EnvConfig(name="Pendulum-v1", max_episode_steps=30, action_repeat=2)


def test_collected_episodes_report_whole_episodes_across_batch_boundaries():
    torch.manual_seed(0)
    env = make_env(PENDULUM, ALGO, seed=3)
    collector = Collector(env, policy=None, frames_per_batch=25, total_frames=100)
    episodes = CollectedEpisodes()
    batches = []
    try:
        for batch in collector:
            batches.append(batch)
            episodes.add(batch)
    finally:
        collector.shutdown()
        close_env(env)
    steps = torch.cat(batches)
    # What each episode returned, summed here step by step from the rewards replay stores.
    ends = steps["next", "done"].reshape(-1).nonzero().reshape(-1).tolist()
    rewards = steps["next", "reward"].reshape(-1)
    starts = [0, *[e + 1 for e in ends[:-1]]]
    expected = [rewards[s:e + 1].sum().item() for s, e in zip(starts, ends)]
    assert len(expected) == 3  # 100 agent steps: three whole episodes and a third of one
    record = episodes.flush()
    assert record["train_episodes"] == 3
    assert record["train_return_mean"] == pytest.approx(sum(expected) / 3, rel=1e-5)
    assert record["train_return_min"] == pytest.approx(min(expected), rel=1e-5)
    assert record["train_return_max"] == pytest.approx(max(expected), rel=1e-5)
    assert record["train_episode_length"] == 30
    assert episodes.flush() == {}  # each episode is reported once


def test_a_batch_without_an_ending_reports_nothing():
    env = make_env(PENDULUM, ALGO, seed=3)
    try:
        rollout = env.rollout(10)  # a third of an episode
    finally:
        close_env(env)
    episodes = CollectedEpisodes()
    assert episodes.add(rollout) == 0 and episodes.flush() == {}

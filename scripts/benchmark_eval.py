"""Seconds per evaluation: the eval's episodes stepped as one batch against one by one.

    MUJOCO_GL=osmesa python scripts/benchmark_eval.py experiment=small env=dmc_proprio env.name=reacher-easy
    python scripts/benchmark_eval.py experiment=small env=pendulum eval.episodes=10 --rounds 5 --json out.json

Builds the preset's models (untrained: the policy's cost does not depend on its
weights) and times one evaluation of ``eval.episodes`` deterministic episodes
two ways, in alternating rounds in this process:
- ``batched``: what the trainer runs (``make_eval_env`` + ``evaluate``): one
  env per episode, all stepped together, the policy called once per step on
  the batch;
- ``one_by_one``: the episodes in turn on one env, the policy called once per
  step per episode (how evaluation ran before 2026-11-25).
Prints the median seconds per evaluation of each, the ratio and the env frames
per second. Keys in --json: ``batched_s``, ``one_by_one_s``, ``speedup``
(one_by_one_s / batched_s), ``batched_rounds`` / ``one_by_one_rounds`` (each
round's seconds), ``episodes``, ``frames_per_eval``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_update import compose  # noqa: E402


def one_by_one(env, policy, episodes: int, max_steps: int) -> tuple[list[float], int]:
    """The episodes' returns and their agent steps in all."""
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    returns, steps = [], 0
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        for _ in range(episodes):
            rollout = env.rollout(max_steps, policy, auto_cast_to_device=True, break_when_any_done=True)
            returns.append(float(rollout["next", "episode_reward"][-1]))
            steps += rollout.shape[0]
    return returns, steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m dreamer")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (one evaluation each way)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the learner's, which evaluates)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)

    from dreamer.algos.registry import algorithm
    from dreamer.envs.factory import close_env, make_env, make_eval_env
    from dreamer.errors import UserError
    from dreamer.report.evaluation import evaluate

    torch.set_num_threads(args.threads)
    try:
        cfg = compose(args.overrides)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    episodes, max_steps = cfg.eval.episodes, cfg.env.max_episode_steps
    single = make_env(cfg.env, cfg.algo, seed=cfg.seed)
    batch = make_eval_env(cfg.env, cfg.algo, episodes=episodes, seed=cfg.seed)
    build_models, _ = algorithm(cfg.algo.name)
    policy = build_models(cfg.algo, cfg.env, single, torch.device("cpu")).policy(explore=False)
    ways = {
        "batched": lambda: evaluate(batch, policy, episodes=episodes, max_steps=max_steps, record=False).returns,
        "one_by_one": lambda: one_by_one(single, policy, episodes, max_steps)[0],
    }
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    frames = 0
    try:
        for name, way in ways.items():  # warm-up: first calls build envs and caches
            way()
        for _ in range(args.rounds):
            for name, way in ways.items():
                start = time.perf_counter()
                returns = way()
                seconds[name].append(time.perf_counter() - start)
                assert len(returns) == episodes
        # Env frames per evaluation (agent steps x action repeat): both ways play whole episodes.
        frames = one_by_one(single, policy, episodes, max_steps)[1] * cfg.env.action_repeat
    finally:
        close_env(batch)
        close_env(single)
    batched, alone = statistics.median(seconds["batched"]), statistics.median(seconds["one_by_one"])
    result = {"batched_s": batched, "one_by_one_s": alone, "speedup": alone / batched,
              "batched_rounds": seconds["batched"], "one_by_one_rounds": seconds["one_by_one"],
              "episodes": episodes, "frames_per_eval": frames, "rounds": args.rounds, "threads": args.threads,
              "overrides": args.overrides}
    print(f"{' '.join(args.overrides)}: {episodes} episodes, ~{frames} env frames per evaluation, "
          f"{args.threads} threads, medians of {args.rounds} alternating rounds")
    print(f"  one by one: {alone:.2f} s   batched: {batched:.2f} s   ({alone / batched:.2f}x; "
          f"batched {frames / batched:.0f} env frames/s)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

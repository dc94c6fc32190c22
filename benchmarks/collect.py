"""Collector stage: env frames/s for 1, 2, 4 workers on a pixel task, and storage bytes per frame.

- ours: dreamer's collector (spawned workers, the acting policy with default
  Dreamer V1 sizes, frames rendered at 64x64 and kept uint8);
- recipe: TorchRL's V1 recipe env setup in one process -- DMControlEnv with its
  default 240x320 render, then ToTensorImage + Resize(64) on the CPU (emulated
  with torch ops: torchvision does not load beside torch 2.13's CPU build).

Bytes per stored frame compare what our replay stores per step (uint8 next
frame only) with the recipe's float32 layout (pixels and next pixels as
float32, plus its state/belief).

    python benchmarks/collect.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from dreamer.algos.v1.models import build_models
from dreamer.config import Config, DreamerV1Config
from dreamer.data.collectors import make_collector
from dreamer.data.replay import bytes_per_step
from dreamer.envs.factory import close_env, make_env
from dreamer.envs.rendering import configure_mujoco_gl


def pixel_config(env_name: str, workers: int, frames_per_batch: int) -> Config:
    cfg = Config(algo=DreamerV1Config())
    cfg.env.backend, cfg.env.name, cfg.env.from_pixels = "dm_control", env_name, True
    cfg.env.max_episode_steps = 500
    cfg.collector.num_workers = workers
    cfg.collector.frames_per_batch = frames_per_batch
    return cfg


def ours_fps(cfg: Config, batches: int, with_policy: bool) -> float:
    """Env frames/s through the collector, after one warm-up batch per worker.

    Without the policy, workers take random actions: the environment setup alone.
    """
    env = make_env(cfg.env, cfg.algo)
    models = build_models(cfg.algo, cfg.env, env, torch.device("cpu"))
    close_env(env)
    random_frames = 0 if with_policy else 10**12
    collector = make_collector(cfg.collector, cfg.env, cfg.algo, cfg.compile, models.policy(explore=True),
                               seed=cfg.seed, workers=cfg.collector.num_workers, random_frames=random_frames,
                               learner_threads=1)
    try:
        it = iter(collector)
        for _ in range(cfg.collector.num_workers):
            next(it)
        start, steps = time.perf_counter(), 0
        for _ in range(batches):
            steps += next(it).numel()
        elapsed = time.perf_counter() - start
    finally:
        collector.shutdown()
    return steps * cfg.env.action_repeat / elapsed


def recipe_fps(env_name: str, steps: int, image_size: int = 64) -> float:
    """TorchRL V1 recipe env: 240x320 render, float + resize on the CPU, one process."""
    configure_mujoco_gl()
    from torchrl.envs import DMControlEnv

    domain, task = env_name.split("-", 1)
    env = DMControlEnv(domain, task.replace("-", "_"), from_pixels=True, pixels_only=True, frame_skip=2)
    td = env.reset()
    start = time.perf_counter()
    for _ in range(steps):
        td["action"] = env.action_spec.rand()
        td = env.step(td)["next"]
        frame = td["pixels"].permute(2, 0, 1).float().div(255)  # ToTensorImage
        F.interpolate(frame[None], size=(image_size, image_size), mode="bilinear", antialias=True)
    elapsed = time.perf_counter() - start
    env.close()
    return steps * 2 / elapsed


def recipe_bytes_per_frame(cfg: Config) -> int:
    """Per stored step in the recipe: float32 pixels and next pixels, state, belief, action, reward, done."""
    c, s = 3, cfg.env.image_size
    pixels = 2 * c * s * s * 4
    latent = (30 + 200) * 4 * 2  # state and belief, root and next
    action = 6 * 4  # cheetah
    scalars = 4 + 3  # reward float, done/terminated/truncated bools
    return pixels + latent + action + scalars


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="cheetah-run", help="DMC domain-task")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--frames-per-batch", type=int, default=50)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()

    result: dict = {"env": args.env}
    for w in args.workers:
        cfg = pixel_config(args.env, w, args.frames_per_batch)
        for mode, with_policy in (("", True), ("env_", False)):
            key = f"{mode}fps_{w}_workers"
            result[key] = statistics.median(
                ours_fps(cfg, args.batches * w, with_policy) for _ in range(args.reps)
            )
            what = "with the policy" if with_policy else "random actions (env setup only)"
            print(f"ours, {w} worker(s), {what}: {result[key]:.1f} env frames/s (median of {args.reps})")
    recipe = statistics.median(recipe_fps(args.env, 100) for _ in range(args.reps))
    result["fps_recipe"] = recipe
    print(f"recipe env setup (random actions): {recipe:.1f} env frames/s")
    if 1 in args.workers and 2 in args.workers:
        result["scale_2_workers"] = result["fps_2_workers"] / result["fps_1_workers"]
    # Like for like: both sides step the environment with random actions.
    result["env_fps_vs_recipe"] = max(result[f"env_fps_{w}_workers"] for w in args.workers) / recipe
    result["collect_fps_vs_recipe"] = max(result[f"fps_{w}_workers"] for w in args.workers) / recipe

    cfg = pixel_config(args.env, 1, args.frames_per_batch)
    env = make_env(cfg.env, cfg.algo)
    ours_bytes = bytes_per_step(env.rollout(2)[0], "pixels")
    close_env(env)
    result["bytes_per_frame"] = ours_bytes
    result["bytes_per_frame_recipe"] = recipe_bytes_per_frame(cfg)
    result["bytes_ratio_vs_recipe"] = ours_bytes / result["bytes_per_frame_recipe"]
    for key in ("scale_2_workers", "env_fps_vs_recipe", "collect_fps_vs_recipe", "bytes_ratio_vs_recipe"):
        if key in result:
            print(f"{key}: {result[key]:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()

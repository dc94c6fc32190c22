"""Time one open-loop imagination report (dreamer/report/openloop.py) as an evaluation makes it.

Builds the pixel models of a config (Hydra overrides, as for `python -m dreamer`),
fills one replay batch with random uint8 frames (the cost does not depend on what
the frames show), and times the two parts of a report separately: the grid
(``learner.prepare`` + ``openloop_video``) and its mp4 encoding
(``RunLogger.log_video``, CSV logger).

    python scripts/benchmark_openloop.py experiment=smoke
    python scripts/benchmark_openloop.py env=pendulum_pixels               # V1 at the default sizes, 16x50
    python scripts/benchmark_openloop.py env=pendulum_pixels algo=dreamer_v3 --reps 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import hydra
import torch
from hydra.core.global_hydra import GlobalHydra
from tensordict import TensorDict

from dreamer.algos.registry import algorithm
from dreamer.config import load_config, register_configs, to_dict
from dreamer.envs.factory import close_env, make_env
from dreamer.envs.keys import PIXELS_KEY
from dreamer.report.logger import RunLogger
from dreamer.report.openloop import openloop_video

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def replayed_batch(cfg, action_dim: int) -> TensorDict:
    """(B*T,) steps as a replay sample holds them."""
    b, e = cfg.buffer, cfg.env
    steps = b.batch_size * b.batch_length
    return TensorDict(
        {
            "action": torch.rand(steps, action_dim) * 2 - 1,
            "next": {
                PIXELS_KEY: torch.randint(0, 256, (steps, e.render_size, e.render_size, 3), dtype=torch.uint8),
                "reward": torch.zeros(steps, 1),
            },
        },
        batch_size=[steps],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. experiment=smoke")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    register_configs()
    GlobalHydra.instance().clear()
    with hydra.initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = load_config(hydra.compose("config", overrides=[*args.overrides, "compile=off", "logger=csv"]))
    if not cfg.env.from_pixels:
        parser.error("the open-loop report needs a pixel task, e.g. env=pendulum_pixels")
    device = torch.device("cpu")
    a = cfg.algo
    env = make_env(cfg.env, cfg.algo, seed=0)
    build, learner_cls = algorithm(a.name)
    models = build(cfg.algo, cfg.env, env, device)
    action_dim = env.action_spec_unbatched.shape[-1]
    close_env(env)
    learner = learner_cls(cfg.algo, cfg.compile, models, device, batch_size=cfg.buffer.batch_size, batch_length=cfg.buffer.batch_length)
    sample = replayed_batch(cfg, action_dim)
    e = cfg.eval
    print(f"{a.name}, batch {cfg.buffer.batch_size}x{cfg.buffer.batch_length}, context {e.openloop_context}, "
          f"{min(e.openloop_sequences, cfg.buffer.batch_size)} sequences, {args.threads} thread(s)")

    with tempfile.TemporaryDirectory() as run_dir:
        logger = RunLogger(cfg.logger, Path(run_dir), run_name="benchmark_openloop", config=to_dict(cfg))
        grid_s, encode_s = [], []
        for rep in range(args.reps + 1):  # the first is a warm-up
            start = time.perf_counter()
            video = openloop_video(models, learner.prepare(sample.clone()), context=e.openloop_context,
                                   sequences=e.openloop_sequences).cpu()
            middle = time.perf_counter()
            logger.log_video(video, "openloop", rep)
            end = time.perf_counter()
            if rep:
                grid_s.append(middle - start)
                encode_s.append(end - middle)
        logger.close()
    print(f"video {tuple(video.shape)} uint8")
    for name, times in (("grid", grid_s), ("mp4", encode_s)):
        print(f"{name:5s} median {statistics.median(times):.3f} s (min {min(times):.3f}, max {max(times):.3f})")
    total = [g + m for g, m in zip(grid_s, encode_s)]
    print(f"total median {statistics.median(total):.3f} s per report")


if __name__ == "__main__":
    main()

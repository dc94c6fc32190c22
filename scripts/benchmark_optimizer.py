"""Adam step time on the Dreamer V1 parameters: foreach vs fused (the learner uses fused).

Fused Adam is what lets a non-finite step be skipped on the device (its
``found_inf`` argument, see dreamer/run/health.py); this measures what it costs or
saves per step on this machine. Gradients are random; only the step is timed.

    python scripts/benchmark_optimizer.py --hidden 400 --rssm 200 --steps 200 --reps 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dreamer.algos.v1.models import build_models
from dreamer.config import load_config
from dreamer.envs.factory import close_env, make_env


def time_steps(params, steps: int, **adam_kwargs) -> float:
    """Milliseconds per optimiser step (after 5 warm-up steps)."""
    opt = torch.optim.Adam(params, lr=1e-4, **adam_kwargs)
    for _ in range(5):
        opt.step()
    start = time.perf_counter()
    for _ in range(steps):
        if adam_kwargs.get("fused"):
            opt.found_inf = torch.zeros(())  # as the learner passes it
        opt.step()
    return (time.perf_counter() - start) / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=400)
    parser.add_argument("--rssm", type=int, default=200)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config({"algo": {"hidden_dim": args.hidden, "rssm_hidden_dim": args.rssm}})
    env = make_env(cfg.env, cfg.algo, seed=0)
    params = list(build_models(cfg.algo, cfg.env, env, torch.device("cpu")).modules.parameters())
    close_env(env)
    for p in params:
        p.grad = torch.randn_like(p)
    print(f"{sum(p.numel() for p in params):,} parameters, {args.threads} thread(s)")
    for name, kwargs in (("foreach", {"foreach": True}), ("fused", {"fused": True})):
        times = [time_steps(params, args.steps, **kwargs) for _ in range(args.reps)]
        print(f"{name:8s} median {statistics.median(times):.2f} ms/step (min {min(times):.2f}, max {max(times):.2f})")


if __name__ == "__main__":
    main()

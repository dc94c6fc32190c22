"""Seconds per learner update for any preset and overrides: what sizes and batch shapes cost.

    python scripts/benchmark_update.py experiment=pendulum
    python scripts/benchmark_update.py experiment=pendulum buffer.batch_length=32 --threads 1 2
    python scripts/benchmark_update.py experiment=pendulum --compile --json out.json
    python scripts/benchmark_update.py experiment=gym_state --rssm-step-ab 5

Builds the preset's models and learner (V1 or V3) on the CPU, fills its replay
buffer with one real rollout of the acting policy (as the collector would), then
times ``learner.update(replay.sample())``: --reps updates after --warmup
untimed ones, for each thread count; prints the median seconds per update,
updates/s and the median process CPU seconds (robust on a shared box). With
--compile the same config is also timed with its actor/value losses compiled
(compile.enabled=true), after reporting the compile warm-up time. Keys in --json:
per thread count, ``eager_s`` / ``compiled_s`` (median s/update),
``compile_warmup_s`` and ``compiled_vs_eager`` (eager_s / compiled_s).

--rssm-step-ab ROUNDS (Dreamer V3): one learner with compiled losses and a
compiled RSSM step (compile.rssm_step), timed in alternating rounds with the
world model's step compiled and eager (``torchrl_ext.eager_rollout_step``): what
the compiled step alone buys, side by side in one process. Keys per thread
count: ``rssm_step_eager_s`` / ``rssm_step_compiled_s`` (medians over the
rounds of each round's median) and ``rssm_step_speedup``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from dreamer.config import load_config, register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return load_config(hydra_compose("config", overrides=overrides))


def build(cfg, fill_steps: int | None = None):
    """Learner and a replay buffer filled by ``fill_steps`` steps of the acting policy (default: 4 batches,
    at least 1000); prefetch off: nothing runs beside the timing."""
    from dreamer.algos.registry import algorithm
    from dreamer.data.replay import make_replay_buffer, write
    from dreamer.envs.factory import close_env, make_env

    cfg.buffer.prefetch = 0
    a, cpu = cfg.algo, torch.device("cpu")
    env = make_env(cfg.env, cfg.algo, seed=cfg.seed)
    build_models, learner_cls = algorithm(a.name)
    models = build_models(cfg.algo, cfg.env, env, cpu)
    learner = learner_cls(cfg.algo, cfg.compile, models, cpu,
                          batch_size=cfg.buffer.batch_size, batch_length=cfg.buffer.batch_length)
    replay = make_replay_buffer(cfg.buffer, cpu)
    steps = fill_steps or max(4 * cfg.buffer.batch_size * cfg.buffer.batch_length, 1000)
    with torch.no_grad():
        rollout = env.rollout(steps, models.policy(explore=True), break_when_any_done=False)
    rollout["collector", "traj_ids"] = torch.zeros(rollout.shape[0], dtype=torch.long)
    write(replay, rollout, models.obs_key)
    close_env(env)
    return learner, replay


def time_updates(update, next_batch, warmup: int, reps: int) -> dict:
    """Median wall and process-CPU seconds of ``reps`` calls of ``update(next_batch())`` after ``warmup``
    untimed ones (``next_batch`` runs outside the timing): ``wall_s``, ``cpu_s`` and every wall time."""
    for _ in range(warmup):
        update(next_batch())
    walls, cpus = [], []
    for _ in range(reps):
        batch = next_batch()
        wall, cpu = time.perf_counter(), time.process_time()
        update(batch)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return {"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus), "walls": walls}


def rssm_step_ab(cfg, rounds: int, warmup: int, reps: int) -> dict:
    """Alternating rounds, eager step then compiled step, on one compiled learner."""
    from torchrl_ext import eager_rollout_step

    if cfg.algo.name != "dreamer_v3" or not cfg.compile.rssm_step:
        raise SystemExit("--rssm-step-ab needs a Dreamer V3 preset with compile.rssm_step=true")
    torch.manual_seed(cfg.seed)
    learner, replay = build(cfg)
    learner.compile()
    out: dict = {"compile_warmup_s": learner.warmup(replay.sample()), "eager_rounds": [], "compiled_rounds": []}
    for _ in range(rounds):
        with eager_rollout_step(learner.models.rollout):
            out["eager_rounds"].append(time_updates(learner.update, replay.sample, warmup, reps)["wall_s"])
        out["compiled_rounds"].append(time_updates(learner.update, replay.sample, warmup, reps)["wall_s"])
    out["rssm_step_eager_s"] = statistics.median(out["eager_rounds"])
    out["rssm_step_compiled_s"] = statistics.median(out["compiled_rounds"])
    out["rssm_step_speedup"] = out["rssm_step_eager_s"] / out["rssm_step_compiled_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. experiment=pendulum")
    parser.add_argument("--threads", type=int, nargs="+", default=[torch.get_num_threads()])
    parser.add_argument("--warmup", type=int, default=3, help="untimed updates first (default 3)")
    parser.add_argument("--reps", type=int, default=10, help="timed updates (default 10)")
    parser.add_argument("--compile", action="store_true", help="also time compiled actor/value losses")
    parser.add_argument("--rssm-step-ab", type=int, metavar="ROUNDS",
                        help="V3: compiled losses with the RSSM step eager vs compiled, alternating ROUNDS rounds")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)

    results: dict = {"overrides": args.overrides, "threads": {}}
    if args.rssm_step_ab:
        print(f"{'threads':>7} {'RSSM step':>9} {'s/update':>9} (losses compiled; median of "
              f"{args.rssm_step_ab} rounds of {args.reps})")
        for threads in args.threads:
            torch.set_num_threads(threads)
            row = rssm_step_ab(compose([*args.overrides, "compile.enabled=true"]), args.rssm_step_ab,
                               args.warmup, args.reps)
            print(f"{threads:>7} {'eager':>9} {row['rssm_step_eager_s']:9.3f}\n{threads:>7} {'compiled':>9} "
                  f"{row['rssm_step_compiled_s']:9.3f}\n{threads:>7} compiled step vs eager step: "
                  f"{row['rssm_step_speedup']:.2f}x (rounds: eager {row['eager_rounds']}, "
                  f"compiled {row['compiled_rounds']})", flush=True)
            results["threads"][str(threads)] = row
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
        return 0
    print(f"{'threads':>7} {'mode':>9} {'s/update':>9} {'updates/s':>10} {'cpu s/update':>13}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        row: dict = {}
        modes = ["eager"] + (["compiled"] if args.compile else [])
        for mode in modes:
            cfg = compose([*args.overrides, f"compile.enabled={mode == 'compiled'}"])
            torch.manual_seed(cfg.seed)
            learner, replay = build(cfg)
            if mode == "compiled":
                learner.compile()
                row["compile_warmup_s"] = learner.warmup(replay.sample())
                print(f"{threads:>7} {'warm-up':>9} {row['compile_warmup_s']:9.1f} s")
            timed = time_updates(learner.update, replay.sample, args.warmup, args.reps)
            wall, cpu = timed["wall_s"], timed["cpu_s"]
            row[f"{mode}_s"], row[f"{mode}_cpu_s"] = wall, cpu
            print(f"{threads:>7} {mode:>9} {wall:9.3f} {1 / wall:10.2f} {cpu:13.3f}", flush=True)
        if args.compile:
            row["compiled_vs_eager"] = row["eager_s"] / row["compiled_s"]
            print(f"{threads:>7} compiled vs eager: {row['compiled_vs_eager']:.2f}x")
        results["threads"][str(threads)] = row
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

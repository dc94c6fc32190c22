"""Seconds per learner update for any preset and overrides: what sizes and batch shapes cost.

    python scripts/benchmark_update.py experiment=pendulum
    python scripts/benchmark_update.py experiment=pendulum buffer.batch_length=32 --threads 1 2
    python scripts/benchmark_update.py experiment=pendulum --compile --json out.json
    python scripts/benchmark_update.py experiment=gym_state --rssm-step-ab 5
    python scripts/benchmark_update.py experiment=small algo.actor_grad=reinforce --imagination-graph-ab 5

Builds the preset's models and learner (V1 or V3) on the CPU, fills its replay
buffer with one real rollout of the acting policy (as the collector would), then
times ``learner.update(replay.sample())``: --reps updates after --warmup
untimed ones, for each thread count; prints the median seconds per update,
updates/s and the median process CPU seconds (robust on a shared box). The
process's malloc policy is the app's (``retain_host_memory``, on by default). With
--compile the same config is also timed with its actor/value losses compiled
(compile.enabled=true), after reporting the compile warm-up time. Keys in --json:
per thread count, ``eager_s`` / ``compiled_s`` (median s/update),
``compile_warmup_s`` and ``compiled_vs_eager`` (eager_s / compiled_s).

--flops: also counts the floating-point operations of one eager update
(matmuls and convolutions, forward and backward, as ``torch.utils.flop_counter``
counts them) and times this CPU's best fp32 rate on a large square matmul, a
rate no update's mix of smaller products reaches: ``update_flops`` /
``matmul_flops_per_s`` = ``update_floor_s``, the fewest seconds one update can
take here, whatever the implementation. Beside ``eager_s`` it gives the update's
achieved fraction of that rate (``matmul_rate_fraction``). Cheapest for a large
preset with ``--warmup 0 --reps 1 --fill-steps`` one batch of sequences.

--rssm-step-ab ROUNDS (Dreamer V3): one learner with compiled losses and a
compiled RSSM step (compile.rssm_step), timed in alternating rounds with the
world model's step compiled and eager (``torchrl_ext.eager_rollout_step``): what
the compiled step alone buys, side by side in one process. Keys per thread
count: ``rssm_step_eager_s`` / ``rssm_step_compiled_s`` (medians over the
rounds of each round's median) and ``rssm_step_speedup``.

--imagination-graph-ab ROUNDS (Dreamer V3 with a REINFORCE actor loss: discrete
actions or algo.actor_grad=reinforce): one learner (compiled if the preset
compiles) timed in alternating rounds with the imagined rollout recording
autograd, as upstream does, and without (``ScoreFunctionDreamerEnv``, as built).
Keys per thread count: ``imagination_graph_recorded_s`` /
``imagination_graph_skipped_s`` and ``imagination_graph_speedup``.
"""

from __future__ import annotations

import argparse
import contextlib
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
    at least 1000); prefetch off: nothing runs beside the timing. With ``retain_host_memory`` (the default)
    this process's malloc keeps freed memory, as the app's learner process does at start
    (dreamer/run/build.py): without it a size1m update page-faults ~14k times."""
    from dreamer.algos.registry import algorithm
    from dreamer.data.replay import make_replay_buffer, write
    from dreamer.envs.factory import close_env, make_env
    from dreamer.system.memory import retain_freed_host_memory

    if cfg.retain_host_memory:
        retain_freed_host_memory()
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


class _Everywhere:
    """A module tracker that files every op under FlopCounterMode's "Global" total: the real one keys a
    WeakKeyDictionary by module, and looking up a TensorDictParams module there compares it with ``==``,
    which is elementwise for a tensordict ("Converting a tensordict to boolean value is not permitted")."""

    parents = frozenset({"Global"})

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def update_flops(learner, batch) -> int:
    """FLOPs of one update on ``batch`` as torch's FlopCounterMode counts them (eager ops only: compiled
    code hides its products from the counter)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    counter.mod_tracker = _Everywhere()  # the total only (why: _Everywhere)
    with counter:
        learner.update(batch)
    return counter.get_total_flops()


def matmul_flops_per_s(n: int = 2048, reps: int = 5) -> float:
    """The best fp32 rate of ``reps`` n x n by n x n matmuls (2 n^3 FLOPs each) after one warm-up, with this
    process's threads: a ceiling for an update's smaller matmuls and convolutions."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


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


def flop_floor(learner, replay, eager_s: float) -> dict:
    """One update's FLOPs, this CPU's matmul rate and the floor they give, beside the timed ``eager_s``."""
    flops, rate = update_flops(learner, replay.sample()), matmul_flops_per_s()
    return {"update_flops": flops, "matmul_flops_per_s": rate, "update_floor_s": flops / rate,
            "matmul_rate_fraction": flops / rate / eager_s}


def alternating_rounds(learner, replay, variant, rounds: int, warmup: int, reps: int) -> tuple[list, list]:
    """Median seconds per update of each round, ``variant()`` (a context) open and
    closed in turn, on one learner: ``(with_variant, as_built)`` lists."""
    with_variant, as_built = [], []
    for _ in range(rounds):
        with variant():
            with_variant.append(time_updates(learner.update, replay.sample, warmup, reps)["wall_s"])
        as_built.append(time_updates(learner.update, replay.sample, warmup, reps)["wall_s"])
    return with_variant, as_built


@contextlib.contextmanager
def recorded_imagination(learner):
    """The imagined rollout records autograd, as upstream's ``DreamerEnv`` does."""
    env = learner.models.model_based_env
    kept, env.rollout_gradients = env.rollout_gradients, True
    try:
        yield
    finally:
        env.rollout_gradients = kept


def imagination_graph_ab(cfg, rounds: int, warmup: int, reps: int) -> dict:
    """Alternating rounds, imagination recorded then not, on one REINFORCE learner."""
    if cfg.algo.name != "dreamer_v3":
        raise SystemExit("--imagination-graph-ab needs a Dreamer V3 preset with a REINFORCE actor loss")
    torch.manual_seed(cfg.seed)
    learner, replay = build(cfg)
    if not learner.actor_loss.use_reinforce:
        raise SystemExit("--imagination-graph-ab needs a REINFORCE actor loss: add algo.actor_grad=reinforce "
                         "or use a discrete-action env")
    out: dict = {}
    if cfg.compile.enabled:
        learner.compile()
        out["compile_warmup_s"] = learner.warmup(replay.sample())
    out["recorded_rounds"], out["skipped_rounds"] = alternating_rounds(
        learner, replay, lambda: recorded_imagination(learner), rounds, warmup, reps)
    out["imagination_graph_recorded_s"] = statistics.median(out["recorded_rounds"])
    out["imagination_graph_skipped_s"] = statistics.median(out["skipped_rounds"])
    out["imagination_graph_speedup"] = out["imagination_graph_recorded_s"] / out["imagination_graph_skipped_s"]
    return out


def rssm_step_ab(cfg, rounds: int, warmup: int, reps: int) -> dict:
    """Alternating rounds, eager step then compiled step, on one compiled learner."""
    from torchrl_ext import eager_rollout_step

    if cfg.algo.name != "dreamer_v3" or not cfg.compile.rssm_step:
        raise SystemExit("--rssm-step-ab needs a Dreamer V3 preset with compile.rssm_step=true")
    torch.manual_seed(cfg.seed)
    learner, replay = build(cfg)
    learner.compile()
    out: dict = {"compile_warmup_s": learner.warmup(replay.sample())}
    out["eager_rounds"], out["compiled_rounds"] = alternating_rounds(
        learner, replay, lambda: eager_rollout_step(learner.models.rollout), rounds, warmup, reps)
    out["rssm_step_eager_s"] = statistics.median(out["eager_rounds"])
    out["rssm_step_compiled_s"] = statistics.median(out["compiled_rounds"])
    out["rssm_step_speedup"] = out["rssm_step_eager_s"] / out["rssm_step_compiled_s"]
    return out


def run_ab(args, results: dict, ab, rounds: int, overrides: list[str], what: str, mode: str,
           sides: tuple, speedup_key: str, speedup_text: str) -> int:
    """Run one alternating A/B (``ab(cfg, rounds, warmup, reps)``) per thread count and print it:
    ``sides`` = ((label, seconds key, rounds key) as A, then as built)."""
    print(f"{'threads':>7} {what:>12} {'s/update':>9} ({mode}; median of {rounds} rounds of {args.reps})")
    for threads in args.threads:
        torch.set_num_threads(threads)
        row = ab(compose([*args.overrides, *overrides]), rounds, args.warmup, args.reps)
        for label, key, _ in sides:
            print(f"{threads:>7} {label:>12} {row[key]:9.3f}")
        rounds_text = ", ".join(f"{label} {row[key]}" for label, _, key in sides)
        print(f"{threads:>7} {speedup_text}: {row[speedup_key]:.2f}x (rounds: {rounds_text})", flush=True)
        results["threads"][str(threads)] = row
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


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
    parser.add_argument("--imagination-graph-ab", type=int, metavar="ROUNDS",
                        help="V3, REINFORCE: imagination recording autograd vs not, alternating ROUNDS rounds")
    parser.add_argument("--flops", action="store_true",
                        help="also count one eager update's FLOPs against this CPU's matmul rate (its floor)")
    parser.add_argument("--fill-steps", type=int, metavar="N",
                        help="replay filled with N acting steps (default: 4 batches of sequences, >= 1000); "
                             "the plain timing and --flops (the A/Bs fill their default)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)

    results: dict = {"overrides": args.overrides, "threads": {}}
    if args.rssm_step_ab:
        return run_ab(args, results, rssm_step_ab, args.rssm_step_ab, ["compile.enabled=true"],
                      "RSSM step", "losses compiled", (("eager", "rssm_step_eager_s", "eager_rounds"),
                                                       ("compiled", "rssm_step_compiled_s", "compiled_rounds")),
                      "rssm_step_speedup", "compiled step vs eager step")
    if args.imagination_graph_ab:
        return run_ab(args, results, imagination_graph_ab, args.imagination_graph_ab, [],
                      "imagination", "the preset's compile setting",
                      (("recorded", "imagination_graph_recorded_s", "recorded_rounds"),
                       ("not recorded", "imagination_graph_skipped_s", "skipped_rounds")),
                      "imagination_graph_speedup", "not recorded vs recorded")
    print(f"{'threads':>7} {'mode':>9} {'s/update':>9} {'updates/s':>10} {'cpu s/update':>13}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        row: dict = {}
        modes = ["eager"] + (["compiled"] if args.compile else [])
        for mode in modes:
            cfg = compose([*args.overrides, f"compile.enabled={mode == 'compiled'}"])
            torch.manual_seed(cfg.seed)
            learner, replay = build(cfg, args.fill_steps)
            if mode == "compiled":
                learner.compile()
                row["compile_warmup_s"] = learner.warmup(replay.sample())
                print(f"{threads:>7} {'warm-up':>9} {row['compile_warmup_s']:9.1f} s")
            timed = time_updates(learner.update, replay.sample, args.warmup, args.reps)
            wall, cpu = timed["wall_s"], timed["cpu_s"]
            row[f"{mode}_s"], row[f"{mode}_cpu_s"] = wall, cpu
            print(f"{threads:>7} {mode:>9} {wall:9.3f} {1 / wall:10.2f} {cpu:13.3f}", flush=True)
            if args.flops and mode == "eager":
                row.update(flop_floor(learner, replay, wall))
                print(f"{threads:>7} {row['update_flops'] / 1e9:.4g} GFLOP per update at "
                      f"{row['matmul_flops_per_s'] / 1e9:.0f} GFLOP/s (fp32 matmul): at least "
                      f"{row['update_floor_s']:.3f} s per update here; eager reaches "
                      f"{row['matmul_rate_fraction']:.0%} of that rate", flush=True)
        if args.compile:
            row["compiled_vs_eager"] = row["eager_s"] / row["compiled_s"]
            print(f"{threads:>7} compiled vs eager: {row['compiled_vs_eager']:.2f}x")
        results["threads"][str(threads)] = row
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

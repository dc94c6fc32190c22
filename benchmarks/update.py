"""Seconds per learner update for any preset and overrides: what sizes and batch shapes cost.

    python benchmarks/update.py experiment=small
    python benchmarks/update.py experiment=small buffer.batch_length=32 --threads 1 2
    python benchmarks/update.py experiment=small --compile --json out.json
    python benchmarks/update.py experiment=atari100k_v3 --flops --warmup 0 --reps 1 --fill-steps 1024
    python benchmarks/update.py experiment=small --against algo.joint_update=false algo.repval_grad=false
    python benchmarks/update.py experiment=small --compile --threads 1 --against algo.joint_update=false

--against OVERRIDE ...: a second learner with these overrides added to the first's, built in this
process from the same seed and replay contents, and the two timed in alternating rounds
(--rounds, each --reps updates of each, the order swapped every round): ``a_s`` / ``b_s`` (the
medians of each side's round medians) and ``a_vs_b`` (b_s / a_s: > 1, the first is faster), the
figure a drifting shared machine does not move. Eager, or both sides compiled with --compile.

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
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from harness import build, compose, time_calls, write_report


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
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def flop_floor(learner, replay, eager_s: float) -> dict:
    """One update's FLOPs, this CPU's matmul rate and the floor they give, beside the timed ``eager_s``."""
    flops, rate = update_flops(learner, replay.sample()), matmul_flops_per_s()
    return {"update_flops": flops, "matmul_flops_per_s": rate, "update_floor_s": flops / rate,
            "matmul_rate_fraction": flops / rate / eager_s}


def side_by_side(args) -> int:
    """The first learner (the overrides) and the second (with --against added) in alternating rounds."""
    import statistics

    import torch

    if args.threads:
        torch.set_num_threads(args.threads[0])
    sides = {}
    for name, extra in (("a", []), ("b", args.against)):
        cfg = compose([*args.overrides, *extra, f"compile.enabled={args.compile}"])
        torch.manual_seed(cfg.seed)
        sides[name] = learner, replay = build(cfg, args.fill_steps)
        if args.compile:
            learner.compile()
            print(f"{name}: compile warm-up {learner.warmup(replay.sample()):.1f} s", flush=True)
    rounds: dict[str, list[float]] = {"a": [], "b": []}
    for index in range(args.rounds):
        for name in ("a", "b") if index % 2 == 0 else ("b", "a"):
            learner, replay = sides[name]
            rounds[name].append(time_calls(learner.update, replay.sample, args.warmup, args.reps)["wall_s"])
        print(f"round {index + 1}: a {rounds['a'][-1]:.3f} s, b {rounds['b'][-1]:.3f} s per update", flush=True)
    a_s, b_s = statistics.median(rounds["a"]), statistics.median(rounds["b"])
    results = {"overrides": args.overrides, "against": args.against, "a_s": a_s, "b_s": b_s, "a_vs_b": b_s / a_s,
               "a_round_s": rounds["a"], "b_round_s": rounds["b"], "threads": torch.get_num_threads()}
    print(f"a {a_s:.3f} s, b {b_s:.3f} s per update: a is {b_s / a_s:.2f}x b")
    write_report(args.json, results)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. experiment=small")
    parser.add_argument("--threads", type=int, nargs="+", help="intra-op thread counts (default: torch's own)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed updates first (default 3)")
    parser.add_argument("--reps", type=int, default=10, help="timed updates (default 10)")
    parser.add_argument("--compile", action="store_true", help="also time compiled actor/value losses")
    parser.add_argument("--flops", action="store_true",
                        help="also count one eager update's FLOPs against this CPU's matmul rate (its floor)")
    parser.add_argument("--fill-steps", type=int, metavar="N",
                        help="replay filled with N acting steps (default: 4 batches of sequences, >= 1000); "
                             "the plain timing and --flops (the A/Bs fill their default)")
    parser.add_argument("--against", nargs="+", metavar="OVERRIDE",
                        help="time a second learner with these overrides added, in alternating rounds")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds of --against (default 5)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    if args.against:
        return side_by_side(args)
    import torch  # after parsing: --help answers without it

    results: dict = {"overrides": args.overrides, "threads": {}}
    print(f"{'threads':>7} {'mode':>9} {'s/update':>9} {'updates/s':>10} {'cpu s/update':>13}")
    for threads in args.threads or [torch.get_num_threads()]:
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
            timed = time_calls(learner.update, replay.sample, args.warmup, args.reps)
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
    write_report(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

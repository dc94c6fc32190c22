"""Peak RSS of a training run (main process plus collector workers), and the replay's share.

Runs `python -m dreamer` with the given overrides (default: TorchRL V1 recipe's
memory-relevant settings -- DMC cheetah-run from 64x64 pixels, action repeat 2,
one collector, batch 16x50, 100k-step buffer) and samples the RSS of the whole
process tree every --interval seconds until it exits or --seconds pass.

The buffer is allocated in full at its first write, so a run that reaches
learning already holds its peak replay memory.

    python scripts/benchmark_memory.py --seconds 240 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import psutil

RECIPE_LIKE = [
    "env=dmc", "env.name=cheetah-run", "collector.num_workers=1", "buffer.batch_size=16",
    "buffer.batch_length=50", "buffer.capacity=100000", "collector.init_random_frames=1000",
    "logger=none", "eval.every=100000", "checkpoint.every=100000", "compile=off",
]


def tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", default=RECIPE_LIKE)
    parser.add_argument("--seconds", type=float, default=240)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--recipe-gib", type=float, default=14.1,
                        help="the recipe's peak RSS at the same settings (measured 2026-11-21 on this CPU)")
    parser.add_argument("--json")
    args = parser.parse_args()

    run_dir = tempfile.mkdtemp(prefix="bench_mem_")
    cmd = [sys.executable, "-m", "dreamer", *args.overrides, f"hydra.run.dir={run_dir}",
           "logger.progress_bar=false"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "SDL_VIDEODRIVER": "dummy"})
    ps = psutil.Process(proc.pid)
    peak, start = 0, time.monotonic()
    while proc.poll() is None and time.monotonic() - start < args.seconds:
        peak = max(peak, tree_rss(ps))
        time.sleep(args.interval)
    if proc.poll() is None:
        proc.terminate()
        proc.wait(timeout=60)
    result = {"peak_rss_gib": peak / 2**30, "recipe_peak_rss_gib": args.recipe_gib,
              "rss_ratio_vs_recipe": peak / 2**30 / args.recipe_gib, "command": " ".join(cmd)}
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()

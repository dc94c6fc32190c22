"""Peak RSS of a training run (main process plus collector workers), and the replay's share.

Runs `python -m dreamer` with the given overrides (default: TorchRL V1 recipe's
memory-relevant settings -- DMC cheetah-run from 64x64 pixels, action repeat 2,
one collector, batch 16x50, 100k-step buffer) and samples the RSS of the whole
process tree every --interval seconds until it exits or --seconds pass.

The buffer's pages are only resident once written, so a short run holds
part of it: the script also reports the projection to a full buffer,
peak + (capacity - steps stored) x bytes per stored step (from the run's
log line "replay: N steps x B bytes" and its metrics.jsonl).

    python benchmarks/memory.py --seconds 240 --json out.json
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


def _replay_line(run_dir: str) -> tuple[int, int]:
    import re

    text = open(os.path.join(run_dir, "dreamer.log")).read()
    match = re.search(r"replay: (\d+) steps x (\d+) bytes", text)
    return int(match.group(1)), int(match.group(2))


def _last_frames(run_dir: str) -> int:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return 0
    lines = open(path).read().splitlines()
    return json.loads(lines[-1])["frames"] if lines else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", default=RECIPE_LIKE)
    parser.add_argument("--seconds", type=float, default=240)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--recipe-gib", type=float, default=14.1,
                        help="the recipe's peak RSS at the same settings (default: docs/PERFORMANCE.md's figure)")
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
    capacity, step_bytes = _replay_line(run_dir)
    frames = _last_frames(run_dir)
    repeat = 2 if "env=dmc" in args.overrides else 1
    stored = min(capacity, frames // repeat)
    full = peak + (capacity - stored) * step_bytes
    result = {
        "peak_rss_gib": peak / 2**30, "steps_stored": stored, "bytes_per_step": step_bytes,
        "projected_full_buffer_rss_gib": full / 2**30, "recipe_peak_rss_gib": args.recipe_gib,
        "rss_ratio_vs_recipe": full / 2**30 / args.recipe_gib, "command": " ".join(cmd),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()

"""Updates/s with replay prefetch threads sampling a storage past ATen's grain, their
torch ops on one intra-op thread (as built) or on the process's count (upstream's pool).

    python scripts/benchmark_prefetch.py experiment=small_v1 env=pendulum --rounds 3
    python scripts/benchmark_prefetch.py experiment=pendulum --stored-steps 60000 --updates 200

Each side runs in its own process (an OpenMP team, once a thread has started one,
lasts as long as the thread, so two sides in one process would share its effect),
alternating, ``--rounds`` times. A process builds the preset's learner, fills a
replay buffer with ``--stored-steps`` steps (one rollout of the acting policy,
repeated under new trajectory ids) sampled by ``buffer.prefetch`` threads, and times
``learner.update(replay.sample())`` over ``--updates`` updates after ``--warmup``. It
prints each process's updates/s, the threads it ended with and its CPU use, then the
median updates/s per side and their ratio (``speedup``; keys in --json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchmark_update as bu  # noqa: E402

SIDES = ("upstream", "one_thread")


def _one_side(args) -> dict:
    from dreamer.data.replay import make_replay_buffer

    torch.set_num_threads(args.threads)
    cfg = bu.compose(args.overrides)
    learner, rollout_replay = bu.build(cfg, fill_steps=args.rollout_steps)
    stored = rollout_replay.storage._storage[: len(rollout_replay)]
    cfg.buffer.capacity = max(cfg.buffer.capacity, args.stored_steps)
    cfg.buffer.prefetch = args.prefetch
    replay = make_replay_buffer(cfg.buffer, torch.device("cpu"))
    if args.side == "upstream":  # the pool TorchRL's ReplayBuffer makes
        replay._prefetch_executor.shutdown(wait=False)
        replay._prefetch_executor = ThreadPoolExecutor(max_workers=replay._prefetch_cap)
    copies = -(-args.stored_steps // len(stored))
    for k in range(copies):
        chunk = stored.clone()
        chunk["collector", "traj_ids"] = chunk["collector", "traj_ids"] + k * 1_000_000
        replay.extend(chunk)
    for _ in range(args.warmup):
        learner.update(replay.sample())
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(args.updates):
        learner.update(replay.sample())
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"side": args.side, "updates_per_s": args.updates / wall, "cores_used": cpu / wall,
            "threads": len(os.listdir(f"/proc/{os.getpid()}/task")) if os.path.isdir("/proc/self/task") else None,
            "stored_steps": len(replay)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. experiment=small_v1 env=pendulum")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--updates", type=int, default=150, help="timed updates per process")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--stored-steps", type=int, default=40_000, help="past ATen's grain of 32,768")
    parser.add_argument("--rollout-steps", type=int, default=2_000)
    parser.add_argument("--prefetch", type=int, default=2)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.side:
        print(json.dumps(_one_side(args)))
        return 0
    child_args = [*args.overrides, "--updates", str(args.updates), "--warmup", str(args.warmup),
                  "--stored-steps", str(args.stored_steps), "--rollout-steps", str(args.rollout_steps),
                  "--prefetch", str(args.prefetch), "--threads", str(args.threads)]
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    for r in range(args.rounds):
        for side in SIDES:
            done = subprocess.run([sys.executable, __file__, *child_args, "--side", side],
                                  capture_output=True, text=True, check=True)
            run = json.loads(done.stdout.strip().splitlines()[-1])
            runs[side].append(run)
            print(f"round {r + 1} {side:>10}: {run['updates_per_s']:.2f} updates/s, "
                  f"{run['cores_used']:.2f} cores, {run['threads']} threads", flush=True)
    medians = {side: statistics.median(r["updates_per_s"] for r in runs[side]) for side in SIDES}
    result = {"overrides": args.overrides, "stored_steps": args.stored_steps, "prefetch": args.prefetch,
              "threads": args.threads, "updates_per_s": medians,
              "speedup": medians["one_thread"] / medians["upstream"], "runs": runs}
    print(f"median updates/s: upstream pool {medians['upstream']:.2f}, one intra-op thread per prefetch thread "
          f"{medians['one_thread']:.2f} ({result['speedup']:.2f}x)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

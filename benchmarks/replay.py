"""Seconds per replay write and per sample at a given fill: what the per-env streams cost.

    python benchmarks/replay.py
    python benchmarks/replay.py --capacity 1000000 --workers 16 --batch-length 64 --json replay.json

Fills a replay buffer (the app's: dreamer.data.replay.make_replay_buffer, state vectors of
--obs-dim floats) with --workers streams written in turns, --frames-per-batch steps per write
and an episode end every --episode steps, until it has wrapped once; then times --reps writes
and --reps samples of --batch-size x --batch-length records (no prefetch: the sampler's own
work, which a prefetch thread does beside the learner). Prints and writes (--json) the median
milliseconds of each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from harness import write_report


def stream_batch(worker: int, first: int, steps: int, episode: int, obs_dim: int):
    """One worker's collector batch: ``steps`` transitions from its step ``first``, an episode
    ending every ``episode`` steps."""
    import torch
    from tensordict import TensorDict

    from torchrl_ext import WORKER_KEY

    count = (torch.arange(first, first + steps) % episode).unsqueeze(-1)
    done = count == episode - 1
    return TensorDict({
        "observation": torch.randn(steps, obs_dim), "action": torch.randn(steps, 1), "step_count": count,
        WORKER_KEY: torch.full((steps,), worker),
        "next": {"observation": torch.randn(steps, obs_dim), "reward": torch.randn(steps, 1),
                 "done": done, "terminated": done, "truncated": torch.zeros_like(done)},
    }, batch_size=[steps])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capacity", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=4, help="streams (collector workers)")
    parser.add_argument("--frames-per-batch", type=int, default=100)
    parser.add_argument("--episode", type=int, default=200, help="steps per episode")
    parser.add_argument("--obs-dim", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--batch-length", type=int, default=64)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    import torch

    from dreamer.config import BufferConfig
    from dreamer.data.replay import make_replay_buffer, write

    buffer_cfg = BufferConfig(capacity=args.capacity, batch_size=args.batch_size, batch_length=args.batch_length,
                              prefetch=0)
    replay = make_replay_buffer(buffer_cfg, torch.device("cpu"))
    written = [0] * args.workers

    def write_next(worker: int) -> float:
        batch = stream_batch(worker, written[worker], args.frames_per_batch, args.episode, args.obs_dim)
        written[worker] += args.frames_per_batch
        start = time.perf_counter()
        write(replay, batch, "observation")
        return time.perf_counter() - start

    turn = 0
    while sum(written) < args.capacity * 1.1:  # past one wrap of the ring
        write_next(turn % args.workers)
        turn += 1
    replay.sample()  # the index built once
    writes, samples = [], []
    for _ in range(args.reps):
        writes.append(write_next(turn % args.workers))
        turn += 1
        start = time.perf_counter()
        replay.sample()
        samples.append(time.perf_counter() - start)
    results = {**vars(args), "json": None, "records": len(replay), "write_ms": 1e3 * statistics.median(writes),
               "sample_ms": 1e3 * statistics.median(samples)}
    print(f"{len(replay)} records in {args.workers} streams: write {results['write_ms']:.2f} ms "
          f"({args.frames_per_batch} steps), sample {results['sample_ms']:.2f} ms "
          f"({args.batch_size} x {args.batch_length}, the index rebuilt after each write)")
    write_report(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

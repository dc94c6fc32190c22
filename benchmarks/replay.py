"""Seconds per replay write and per sample at a given fill: what the per-env streams cost.

    python benchmarks/replay.py
    python benchmarks/replay.py --capacity 1000000 --workers 16 --batch-length 64 --json replay.json
    python benchmarks/replay.py --beside-update --threads 2 --rounds 4

Fills a replay buffer (the app's: dreamer.data.replay.make_replay_buffer, state vectors of
--obs-dim floats) with --workers streams written in turns, --frames-per-batch steps per write
and an episode end every --episode steps, until it has wrapped once; then times --reps writes
and --reps samples of --batch-size x --batch-length records, each after a write (the sampler
rebuilds its index of the streams), then --reps samples back to back (a write of 100 steps serves
tens of updates). No prefetch: the sampler's own work, which a prefetch thread does beside the
learner. Prints and writes (--json) the median milliseconds of each.

--beside-update times what that thread costs the learner: `experiment=small` eager updates with
its replay (filled by the acting policy, 20k steps), alone and with a thread that draws one batch
per update as the app's prefetch thread does (on one OpenMP thread, as that one runs), in
alternating rounds (--rounds) in one process.
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
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: a sampler's threads on a busy core wait on each other)")
    parser.add_argument("--beside-update", action="store_true",
                        help="time the update alone and beside a sampling thread instead (see above)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of each side (--beside-update)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    if args.beside_update:
        return beside_update(args)
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
    repeats = []  # samples between writes (a write serves tens of updates): no index to rebuild
    for _ in range(args.reps):
        start = time.perf_counter()
        replay.sample()
        repeats.append(time.perf_counter() - start)
    results = {**vars(args), "json": None, "records": len(replay), "write_ms": 1e3 * statistics.median(writes),
               "sample_after_write_ms": 1e3 * statistics.median(samples),
               "sample_ms": 1e3 * statistics.median(repeats)}
    print(f"{len(replay)} records in {args.workers} streams: write {results['write_ms']:.2f} ms "
          f"({args.frames_per_batch} steps); sample ({args.batch_size} x {args.batch_length}) "
          f"{results['sample_ms']:.2f} ms, {results['sample_after_write_ms']:.2f} ms after a write (the index rebuilt)")
    write_report(args.json, results)
    return 0


def beside_update(args) -> int:
    """Median seconds per update alone and beside a thread sampling one batch per update."""
    import threading

    from harness import build, compose, time_calls

    from torchrl_ext import use_one_intra_op_thread

    learner, replay = build(compose(["experiment=small", "compile=off", f"buffer.capacity={args.capacity}"]),
                            fill_steps=20_000)
    batch = replay.sample()
    requests, stop = threading.Semaphore(0), threading.Event()

    def prefetch() -> None:
        use_one_intra_op_thread()  # as the app's prefetch thread starts (torchrl_ext/replay.py)
        while not stop.is_set():
            if requests.acquire(timeout=0.2):
                replay.sample()

    def with_a_sample():
        requests.release()  # the prefetch thread draws the next batch while this update runs
        return batch.clone()

    thread = threading.Thread(target=prefetch, daemon=True)
    thread.start()
    medians: dict[str, list[float]] = {"alone": [], "beside_sampler": []}
    try:
        for _ in range(args.rounds):
            medians["alone"].append(time_calls(learner.update, batch.clone, 3, args.reps // 2)["wall_s"])
            medians["beside_sampler"].append(time_calls(learner.update, with_a_sample, 3, args.reps // 2)["wall_s"])
    finally:
        stop.set()
        thread.join()
    alone, beside = statistics.median(medians["alone"]), statistics.median(medians["beside_sampler"])
    print(f"update alone {alone:.3f} s, beside the sampling thread {beside:.3f} s ({beside / alone:.2f}x), "
          f"threads={args.threads}, {args.rounds} rounds")
    write_report(args.json, {**vars(args), "json": None, "alone_s": alone, "beside_sampler_s": beside})
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Replay write path: a collector batch of K steps into the storage, three ways.

- direct:   our write path: torchrl_ext.PlainWriteReplayBuffer (no inverse-transform
            clone) + SliceCursorWriter -> one _stack_onto_ into storage[slice]
- fallback: stack the K step tensordicts into a temporary, then copy (what a
            list write costs upstream: _flip_list + storage[index] = data)
- upstream: torchrl's RoundRobinWriter + TensorStorage.set on the lazy stack
            (tensor cursor -> update_at_)

Each step: pixels (64, 64, 3) uint8, state (30,), action (6,), reward, done.
Reports the median ms per write over --reps repetitions (each the mean of
--writes writes, after a warm-up), and speed-ups of direct over the others.

    python scripts/benchmark_stack_onto.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from tensordict import LazyStackedTensorDict, TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data.replay_buffers.writers import RoundRobinWriter

from torchrl_ext import PlainWriteReplayBuffer, SliceCursorWriter

CAPACITY = 20_000


def make_step(i: int) -> TensorDict:
    return TensorDict(
        {
            "pixels": torch.randint(0, 255, (64, 64, 3), dtype=torch.uint8),
            "state": torch.randn(30),
            "action": torch.randn(6),
            "next": {"reward": torch.randn(1), "done": torch.zeros(1, dtype=torch.bool)},
        },
        batch_size=[],
    )


def buffer(writer) -> TensorDictReplayBuffer:
    cls = PlainWriteReplayBuffer if isinstance(writer, SliceCursorWriter) else TensorDictReplayBuffer
    rb = cls(storage=LazyTensorStorage(CAPACITY), writer=writer, batch_size=1)
    rb.extend(LazyStackedTensorDict.lazy_stack([make_step(0)] * 2))  # allocate storage
    return rb


def write_direct(rb, steps):
    rb.extend(LazyStackedTensorDict.lazy_stack(steps))


def write_fallback(rb, steps):
    rb.extend(torch.stack(steps))  # materialise the batch, then copy it in


def write_upstream(rb, steps):
    rb.extend(LazyStackedTensorDict.lazy_stack(steps))


METHODS = {
    "direct": (SliceCursorWriter, write_direct),
    "fallback": (RoundRobinWriter, write_fallback),
    "upstream": (RoundRobinWriter, write_upstream),
}


def time_methods(k: int, writes: int, reps: int) -> dict[str, float]:
    """Median ms per write for each method; the methods alternate within each
    repetition so machine noise hits them alike."""
    steps = [make_step(i) for i in range(k)]
    buffers = {name: buffer(writer_cls()) for name, (writer_cls, _) in METHODS.items()}
    for name, (_, write) in METHODS.items():
        for _ in range(10):
            write(buffers[name], steps)
    samples: dict[str, list[float]] = {name: [] for name in METHODS}
    for _ in range(reps):
        for name, (_, write) in METHODS.items():
            start = time.perf_counter()
            for _ in range(writes):
                write(buffers[name], steps)
            samples[name].append((time.perf_counter() - start) / writes * 1e3)
    return {name: statistics.median(v) for name, v in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ks", type=int, nargs="+", default=[8, 16, 32, 64, 128])
    parser.add_argument("--writes", type=int, default=50)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="write results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    rows = []
    print(f"{'K':>5} {'direct ms':>10} {'fallback ms':>12} {'upstream ms':>12} {'x fallback':>11} {'x upstream':>11}")
    for k in args.ks:
        ms = time_methods(k, args.writes, args.reps)
        row = {"k": k, **{f"{n}_ms": v for n, v in ms.items()},
               "speedup_vs_fallback": ms["fallback"] / ms["direct"],
               "speedup_vs_upstream": ms["upstream"] / ms["direct"]}
        rows.append(row)
        print(f"{k:>5} {ms['direct']:>10.3f} {ms['fallback']:>12.3f} {ms['upstream']:>12.3f} "
              f"{row['speedup_vs_fallback']:>10.2f}x {row['speedup_vs_upstream']:>10.2f}x")
    result = {
        "rows": rows,
        "speedup_vs_fallback": min(r["speedup_vs_fallback"] for r in rows),
        "speedup_vs_upstream": min(r["speedup_vs_upstream"] for r in rows),
    }
    print(f"min speedup vs fallback {result['speedup_vs_fallback']:.2f}x, "
          f"vs upstream {result['speedup_vs_upstream']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()

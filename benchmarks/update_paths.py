"""Seconds per learner update on each update path (compile.update), each in its own process, alternating.

    python benchmarks/update_paths.py experiment=small
    python benchmarks/update_paths.py experiment=gym_state_v3 --rounds 3 --json paths.json
    python benchmarks/update_paths.py experiment=small --paths eager losses whole --threads 2
    python benchmarks/update_paths.py experiment=dmc_vision_v3 --device cuda --paths losses captured
    python benchmarks/update_paths.py experiment=gym_state_v3 --device cuda --paths eager captured_eager

Paths: ``eager`` (compile.enabled=false), ``losses`` (the compiled-losses path, as the CPU ships it:
world model eager, actor/value losses and V3's RSSM step compiled), ``whole``
(the whole update as one torch.compile graph), ``captured`` (CUDA: the whole
update replayed from a CUDA graph), ``captured_eager`` (CUDA: the eager update
body captured, compile.enabled=false: no compile warm-up). Every round runs each path once, in a fresh
process (a compiled function is never shared across processes), in the order
given, so a box slowing down or speeding up meets every path alike. A process
builds the preset's models and learner on ``--device``, fills a replay buffer
with one rollout of the acting policy, compiles and warms up the path (outside
the timing: reported as ``compile_s``; the first round compiles cold unless
inductor's cache is warm), then times ``learner.update(replay.sample())``:
``--reps`` updates after ``--warmup`` untimed ones. Output (stdout, and --json):
per path the median over rounds of each round's median seconds per update
(``<path>_s``), every round's median, ``compile_s`` per round, and
``<path>_vs_losses`` (losses seconds / path seconds; > 1: faster than the compiled-losses path).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import build, compose, time_calls, write_report

PATHS = ("eager", "losses", "whole", "captured", "captured_eager")


def path_overrides(path: str) -> list[str]:
    if path == "eager":
        return ["compile.enabled=false", "compile.update=losses"]
    if path == "captured_eager":
        return ["compile.enabled=false", "compile.update=captured"]
    return ["compile.enabled=true", f"compile.update={path}", "compile.background=false"]


def child(path: str, overrides: list[str], device: str, threads: int | None, warmup: int, reps: int) -> dict:
    """One path in this process: compile and warm up, then the timed updates (a captured path
    warms up and captures in the untimed ones)."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    cfg = compose(overrides + path_overrides(path) + [f"device={device}"])
    learner, replay = build(cfg)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    start = time.perf_counter()
    learner.compile()
    learner.warmup(replay.sample())
    sync()
    compile_s = time.perf_counter() - start
    timed = time_calls(learner.update, replay.sample, warmup, reps, sync)
    learner.flush_metrics()
    return {"path": path, "compile_s": compile_s,
            "wall_s": timed["wall_s"], "cpu_s": timed["cpu_s"], "threads": torch.get_num_threads()}


def run_child(path: str, args, overrides: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, __file__, "--child", path, "--child-out", str(out), "--device", args.device,
                   "--warmup", str(args.warmup), "--reps", str(args.reps), *overrides]
        if args.threads:
            command += ["--threads", str(args.threads)]
        subprocess.run(command, check=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        return json.loads(out.read_text())


def summarize(rounds: dict[str, list[dict]]) -> dict:
    result = {}
    for path, runs in rounds.items():
        result[f"{path}_s"] = statistics.median(r["wall_s"] for r in runs)
        result[f"{path}_round_s"] = [r["wall_s"] for r in runs]
        result[f"{path}_compile_s"] = [r["compile_s"] for r in runs]
    if "losses_s" in result:
        for path in rounds:
            if path != "losses":
                result[f"{path}_vs_losses"] = result["losses_s"] / result[f"{path}_s"]
    return result


def parse(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. experiment=small")
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=["losses", "whole"])
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (one process per path each)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed updates after the compile warm-up")
    parser.add_argument("--reps", type=int, default=20, help="timed updates per process")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    parser.add_argument("--child", choices=PATHS, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.child:
        result = child(args.child, args.overrides, args.device, args.threads, args.warmup, args.reps)
        args.child_out.write_text(json.dumps(result))
        return 0
    rounds: dict[str, list[dict]] = {path: [] for path in args.paths}
    for number in range(args.rounds):
        for path in args.paths:
            run = run_child(path, args, args.overrides)
            rounds[path].append(run)
            print(f"round {number + 1}/{args.rounds} {path}: {run['wall_s'] * 1e3:.1f} ms/update "
                  f"(compile {run['compile_s']:.1f} s, {run['threads']} threads)", flush=True)
    result = {"overrides": args.overrides, "device": args.device, "rounds": args.rounds, **summarize(rounds)}
    print(json.dumps(result, indent=2))
    write_report(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Soak test: run the smoke pipeline for N minutes; report RSS and open file descriptors over time.

Starts `python -m dreamer experiment=smoke` (endless: train.total_frames is
huge) in a fresh run directory, samples the whole process tree every
--interval seconds (RSS, open fds, process count) plus the run's frames and
updates, then stops it with SIGTERM (the graceful path: final checkpoint,
exit 0). Growth is measured after a warm-up (the first --warmup-fraction of
the run: compile, buffer filling up).

    python scripts/soak.py --minutes 30 --json soak.json
    python scripts/soak.py --minutes 2 -- compile=off   # extra overrides after --
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]


def sample(proc: psutil.Process) -> dict:
    """RSS (MiB) and open fds of the main process and of the whole tree."""
    procs = [proc, *proc.children(recursive=True)]
    rss = fds = 0
    main_rss = main_fds = 0
    for p in procs:
        try:
            r, f = p.memory_info().rss, p.num_fds()
        except psutil.Error:
            continue
        rss, fds = rss + r, fds + f
        if p.pid == proc.pid:
            main_rss, main_fds = r, f
    return {"rss_mib": rss / 2**20, "main_rss_mib": main_rss / 2**20, "fds": fds,
            "main_fds": main_fds, "processes": len(procs)}


def progress(run_dir: Path) -> dict:
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return {"frames": 0, "updates": 0}
    for line in reversed(lines):
        try:
            last = json.loads(line)
            return {"frames": last["frames"], "updates": last["updates"]}
        except (json.JSONDecodeError, KeyError):
            continue
    return {"frames": 0, "updates": 0}


def growth(samples: list[dict], warmup_fraction: float) -> dict:
    """Change from the first post-warm-up sample to the last (RSS in MiB and %, fds)."""
    start = samples[min(int(len(samples) * warmup_fraction), len(samples) - 1)]
    end = samples[-1]
    return {
        "from_minute": start["minute"], "to_minute": end["minute"],
        "rss_mib": end["rss_mib"] - start["rss_mib"],
        "rss_pct": 100 * (end["rss_mib"] - start["rss_mib"]) / max(start["rss_mib"], 1e-9),
        "main_rss_mib": end["main_rss_mib"] - start["main_rss_mib"],
        "fds": end["fds"] - start["fds"],
        "processes": end["processes"] - start["processes"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--warmup-fraction", type=float, default=0.2)
    parser.add_argument("--json", type=Path, help="write samples and growth here")
    parser.add_argument("--run-dir", type=Path, help="default: a temporary directory")
    parser.add_argument("overrides", nargs="*", help="extra dreamer overrides (after --)")
    args = parser.parse_args()

    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="dreamer-soak-")) / "run"
    cmd = [sys.executable, "-m", "dreamer", "experiment=smoke", "train.total_frames=1000000000",
           "logger.progress_bar=false", f"hydra.run.dir={run_dir}", *args.overrides]
    env = {**os.environ, "SDL_VIDEODRIVER": "dummy"}
    log_path = run_dir.parent / "soak.log"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    print(f"run: {' '.join(cmd[1:])}\nlog: {log_path}", flush=True)
    with open(log_path, "w") as log:
        child = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL)
    proc = psutil.Process(child.pid)
    start = time.monotonic()
    samples: list[dict] = []
    print(f"{'min':>6} {'frames':>9} {'updates':>8} {'tree RSS MiB':>13} {'main RSS MiB':>13} "
          f"{'fds':>5} {'procs':>5}", flush=True)
    try:
        while time.monotonic() - start < args.minutes * 60 and child.poll() is None:
            time.sleep(min(args.interval, max(args.minutes * 60 - (time.monotonic() - start), 0.1)))
            if child.poll() is not None:
                break
            row = {"minute": (time.monotonic() - start) / 60, **sample(proc), **progress(run_dir)}
            samples.append(row)
            print(f"{row['minute']:6.1f} {row['frames']:9d} {row['updates']:8d} {row['rss_mib']:13.1f} "
                  f"{row['main_rss_mib']:13.1f} {row['fds']:5d} {row['processes']:5d}", flush=True)
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)  # the graceful stop: final checkpoint, exit 0
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    ok = child.returncode == 0
    result = {"command": cmd[1:], "minutes": args.minutes, "returncode": child.returncode,
              "samples": samples, "growth": growth(samples, args.warmup_fraction) if samples else None}
    if result["growth"]:
        g = result["growth"]
        print(f"after warm-up (minute {g['from_minute']:.1f} -> {g['to_minute']:.1f}): tree RSS "
              f"{g['rss_mib']:+.1f} MiB ({g['rss_pct']:+.1f}%), main RSS {g['main_rss_mib']:+.1f} MiB, "
              f"fds {g['fds']:+d}, processes {g['processes']:+d}; exit code {child.returncode}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

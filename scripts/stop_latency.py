"""Stop latency per phase: SIGTERM a run in each phase, time until it has exited with a checkpoint.

For each phase a fresh `python -m dreamer experiment=PRESET ...` runs (its own process group,
as a scheduler would start it) until a marker says it is in that phase, then gets SIGTERM;
the row reports the seconds from the signal to the final checkpoint (its file's mtime) and to
the process's exit (teardown included: workers, logger, summary), and the exit status. Phases:

  prefill     collecting the random steps before the first update
  warmup      compiling the losses before the first update (compile.background=false)
  learning    updates running
  eval        an evaluation in progress (it starts right after the checkpoint due at its update)
  background  the background compile child running (compile.background=true)
  checkpoint  a checkpoint being written (checkpoint.replay=true: a large file)

    python scripts/stop_latency.py                     # every phase, experiment=smoke
    python scripts/stop_latency.py --phases eval,prefill --preset small
    python scripts/stop_latency.py --json stop.json -- threads=2   # extra overrides after --
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
ENDLESS = "train.total_frames=100000000"


def _log_has(text: str, after_s: float = 0.0) -> Callable[[Path], bool]:
    """True ``after_s`` seconds after the run's dreamer.log first holds ``text``."""
    seen: list[float] = []

    def check(run_dir: Path) -> bool:
        if not seen:
            log = run_dir / "dreamer.log"
            if log.is_file() and text in log.read_text():
                seen.append(time.monotonic())
        return bool(seen) and time.monotonic() - seen[0] >= after_s
    return check


def _has_updates(run_dir: Path) -> bool:
    path = run_dir / "metrics.jsonl"
    return path.is_file() and '"loss_' in path.read_text()


def _checkpoint_at(updates: int) -> Callable[[Path], bool]:
    return lambda run_dir: (run_dir / "checkpoints" / f"ckpt_{updates:010d}.pt").is_file()


def _writing_a_checkpoint(run_dir: Path) -> bool:
    return any((run_dir / "checkpoints").glob(".ckpt_*.tmp")) if (run_dir / "checkpoints").is_dir() else False


# phase -> (overrides, marker that the run is in the phase)
PHASES: dict[str, tuple[list[str], Callable[[Path], bool]]] = {
    "prefill": (["compile=off", "collector.init_random_frames=1500", "buffer.capacity=2000", ENDLESS],
                _log_has("filling the replay", after_s=2.0)),
    "warmup": (["compile.enabled=true", "compile.background=false", ENDLESS],
               _log_has("compiling the losses before the first update", after_s=2.0)),
    "learning": (["compile=off", ENDLESS], _has_updates),
    "eval": (["compile=off", "eval.every=20", "checkpoint.every=20", "eval.episodes=64", ENDLESS],
             _checkpoint_at(20)),
    "background": (["compile.enabled=true", "compile.background=true", ENDLESS],
                   _log_has("compiling the actor/value losses in the background", after_s=2.0)),
    "checkpoint": (["compile=off", "checkpoint.replay=true", "buffer.capacity=30000", "checkpoint.every=20",
                    ENDLESS], _writing_a_checkpoint),
}


def newest_checkpoint(run_dir: Path) -> Path | None:
    found = sorted((run_dir / "checkpoints").glob("ckpt_*.pt")) if (run_dir / "checkpoints").is_dir() else []
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def measure(phase: str, preset: str, extra: list[str], work_dir: Path, wait_s: float) -> dict:
    overrides, in_phase = PHASES[phase]
    run_dir = work_dir / phase
    command = [sys.executable, "-m", "dreamer", f"experiment={preset}", *overrides, "logger.progress_bar=false",
               "eval.video=false", f"hydra.run.dir={run_dir}", *extra]
    env = {**os.environ, "SDL_VIDEODRIVER": "dummy"}
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    row = {"phase": phase, "preset": preset, "command": " ".join(["python -m dreamer", *command[3:]])}
    try:
        deadline = time.monotonic() + wait_s
        while not in_phase(run_dir):
            if proc.poll() is not None or time.monotonic() > deadline:
                row["error"] = "ended first" if proc.poll() is not None else f"not in the phase after {wait_s:.0f} s"
                return row
            time.sleep(0.01)
        signalled, wall_signalled = time.monotonic(), time.time()
        proc.send_signal(signal.SIGTERM)
        row["returncode"] = proc.wait(timeout=600)
        row["latency_s"] = round(time.monotonic() - signalled, 2)
        newest = newest_checkpoint(run_dir)
        written = newest.stat().st_mtime - wall_signalled if newest is not None else None
        row["checkpoint_after_signal"] = written is not None and written >= 0
        row["checkpoint_s"] = round(written, 2) if row["checkpoint_after_signal"] else None
        row["checkpoint"] = newest.name if newest is not None else None
        return row
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def cpu_model() -> str:
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="smoke", help="experiment=PRESET for every phase (default: smoke)")
    parser.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated, of: {', '.join(PHASES)}")
    parser.add_argument("--wait", type=float, default=900.0, help="seconds to wait for a run to reach its phase")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("overrides", nargs="*", help="extra overrides for every run (after --)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stopped: the run being measured is killed too
    phases = [p for p in args.phases.split(",") if p]
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        parser.error(f"unknown phase(s): {', '.join(unknown)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="stop_latency_") as work:
        for phase in phases:
            row = measure(phase, args.preset, args.overrides, Path(work), args.wait)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"cpu: {cpu_model()} ({os.cpu_count()} logical cpus)")
    print("| phase | preset | SIGTERM -> checkpoint (s) | SIGTERM -> exit (s) | checkpoint | exit status |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['phase']} | {row['preset']} | {row.get('checkpoint_s')} | "
              f"{row.get('latency_s', row.get('error'))} | {row.get('checkpoint')} | {row.get('returncode')} |")
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu_model(), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Does a preset learn? Train it for a wall-clock budget per seed and check the eval return.

    python scripts/learning_check.py                                  # experiment=pendulum, 3 seeds x 30 min, >= -400
    python scripts/learning_check.py --experiment default --minutes 30 --threshold -400 --seeds 0
    python scripts/learning_check.py --check runs/pendulum/seed_0 ... # judge finished runs again
    python scripts/learning_check.py --seeds 0 -- algo.actor_lr=1e-4  # extra Hydra overrides after --

Seeds run one after another (each has the machine to itself, as the budget
assumes): `python -m dreamer experiment=E seed=S train.max_minutes=M
eval.episodes=N hydra.run.dir=OUT/seed_S`. A seed passes when an evaluation
that finished inside the budget (its ``wall_s``, counted from the start of the
run's process) has a mean return of at least the threshold. Prints a table,
writes ``OUT/learning_check.json`` and ``OUT/learning_curve.png`` (eval
return against wall-clock minutes, mean ± std over seeds); exits 1 when fewer
than --min-pass seeds pass (default: all), 2 on bad input. CI does not run
it: it takes minutes x seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# A run finishes its last collector batch, final evaluation and checkpoint after
# the budget; past this many extra seconds it is considered hung.
GRACE_S = 600


@dataclass
class SeedResult:
    run_dir: str
    best_return: float | None  # best eval mean inside the budget
    best_at_minutes: float | None
    best_at_frames: int | None
    reached_at_minutes: float | None  # the first evaluation at or above the threshold
    final_return: float | None  # the run's last evaluation (may finish past the budget)
    evaluations: int
    wall_minutes: float | None  # the whole process, measured from outside (None: --check)
    passed: bool


def judge(run_dir: Path, minutes: float, threshold: float, wall_minutes: float | None = None) -> SeedResult:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"error: {run_dir}: no metrics.jsonl; pass a run directory")
    evals = [r for r in map(json.loads, path.read_text().splitlines()) if "eval_return_mean" in r]
    if evals and "wall_s" not in evals[0]:
        raise SystemExit(f"error: {run_dir}: its eval records have no wall_s (an older run); rerun it")
    inside = [r for r in evals if r["wall_s"] <= 60.0 * minutes]
    best = max(inside, key=lambda r: r["eval_return_mean"], default=None)
    reached = next((r for r in inside if r["eval_return_mean"] >= threshold), None)
    return SeedResult(
        run_dir=str(run_dir),
        best_return=best["eval_return_mean"] if best else None,
        best_at_minutes=best["wall_s"] / 60.0 if best else None,
        best_at_frames=best["frames"] if best else None,
        reached_at_minutes=reached["wall_s"] / 60.0 if reached else None,
        final_return=evals[-1]["eval_return_mean"] if evals else None,
        evaluations=len(evals),
        wall_minutes=wall_minutes,
        passed=best is not None and best["eval_return_mean"] >= threshold,
    )


def train(experiment: str, seed: int, minutes: float, episodes: int, run_dir: Path, overrides: list[str]) -> float:
    """One seed, in its own process; returns its wall time in minutes."""
    command = [
        sys.executable, "-m", "dreamer", f"experiment={experiment}", f"seed={seed}",
        f"train.max_minutes={minutes}", f"eval.episodes={episodes}", f"hydra.run.dir={run_dir}",
        "logger.progress_bar=false", *overrides,
    ]
    print("$ " + " ".join(command[1:]), flush=True)
    start = time.perf_counter()
    with open(run_dir.parent / f"{run_dir.name}.log", "w") as log:
        result = subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, timeout=60 * minutes + GRACE_S,
                                env={**os.environ, "SDL_VIDEODRIVER": "dummy"})
    if result.returncode != 0:
        raise SystemExit(f"error: seed {seed} exited with {result.returncode}; see {log.name}")
    return (time.perf_counter() - start) / 60.0


def _fmt(value, spec: str) -> str:
    width = spec.split(".")[0].rstrip("df")
    return format("-", ">" + width) if value is None else format(value, spec)


def report(results: list[SeedResult], threshold: float, minutes: float) -> None:
    print(f"\nthreshold {threshold:g} within {minutes:g} min (best eval inside the budget)")
    print(f"{'run':<40} {'reached at min':>14} {'best':>9} {'at min':>7} {'at frames':>10} {'final':>9} "
          f"{'evals':>6} {'wall min':>9}  pass")
    for r in results:
        print(f"{Path(r.run_dir).name:<40} {_fmt(r.reached_at_minutes, '14.1f')} "
              f"{_fmt(r.best_return, '9.1f')} {_fmt(r.best_at_minutes, '7.1f')} "
              f"{_fmt(r.best_at_frames, '10d')} {_fmt(r.final_return, '9.1f')} {r.evaluations:>6} "
              f"{_fmt(r.wall_minutes, '9.1f')}  {'yes' if r.passed else 'NO'}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    overrides: list[str] = []
    if "--" in argv:
        overrides = argv[argv.index("--") + 1:]
        argv = argv[: argv.index("--")]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", default="pendulum", help="preset to train (default pendulum)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--minutes", type=float, default=30.0, help="wall-clock budget per seed (default 30)")
    parser.add_argument("--threshold", type=float, default=-400.0, help="eval return to reach (default -400)")
    parser.add_argument("--episodes", type=int, default=10, help="episodes per evaluation (default 10)")
    parser.add_argument("--min-pass", type=int, help="seeds that must pass (default: all)")
    parser.add_argument("--out", type=Path, help="output directory (default outputs/learning_check/<experiment>)")
    parser.add_argument("--check", type=Path, nargs="+", metavar="RUN_DIR",
                        help="judge these finished runs instead of training")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.episodes <= 0:
        parser.error("--minutes and --episodes must be > 0")

    if args.check:
        out = args.out or args.check[0].parent
        results = [judge(run_dir, args.minutes, args.threshold) for run_dir in args.check]
    else:
        out = args.out or REPO / "outputs" / "learning_check" / args.experiment
        out.mkdir(parents=True, exist_ok=True)
        results = []
        for seed in args.seeds:
            run_dir = out / f"seed_{seed}"
            if run_dir.exists():
                raise SystemExit(f"error: {run_dir} exists; pass another --out or remove it")
            wall = train(args.experiment, seed, args.minutes, args.episodes, run_dir, overrides)
            results.append(judge(run_dir, args.minutes, args.threshold, wall))
    report(results, args.threshold, args.minutes)

    sys.path.insert(0, str(REPO))
    from dreamer.report.plots import load_run, plot_runs

    curve = plot_runs([load_run(Path(r.run_dir)) for r in results], out / "learning_curve.png", x_axis="minutes")
    needed = len(results) if args.min_pass is None else args.min_pass
    passed = sum(r.passed for r in results)
    summary = {"experiment": args.experiment, "minutes": args.minutes, "threshold": args.threshold,
               "episodes": args.episodes, "overrides": overrides, "passed": passed, "needed": needed,
               "seeds": [asdict(r) for r in results]}
    (out / "learning_check.json").write_text(json.dumps(summary, indent=2))
    print(f"\n{passed}/{len(results)} passed (need {needed}); {out / 'learning_check.json'}, {curve}")
    return 0 if passed >= needed else 1


if __name__ == "__main__":
    sys.exit(main())

"""Plot eval return vs frames (mean ± std over seeds) and updates/s for runs.

    python scripts/plot_runs.py multirun/smoke/DATE_TIME --out seeds.png
    python scripts/plot_runs.py outputs/default/RUN_A outputs/default/RUN_B
    python scripts/plot_runs.py runs/joint runs/separate --label joint --label separate

Each argument is a run directory (holding metrics.jsonl) or a directory of
them (a Hydra multirun sweep). Runs of the same experiment and env are seeds
of one curve; with --label (one per argument) the runs under each argument
are one curve of that name: an A/B of two settings of one experiment.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from dreamer.errors import UserError
from dreamer.report.plots import find_runs, load_run, plot_runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    parser.add_argument("--out", type=Path, default=Path("runs.png"), help="PNG to write (default runs.png)")
    parser.add_argument("--x", choices=("frames", "minutes"), default="frames",
                        help="eval return against env frames (default) or wall-clock minutes")
    parser.add_argument("--label", action="append", metavar="NAME",
                        help="the curve's name for the runs under each RUN_DIR, one per RUN_DIR, in order")
    args = parser.parse_args(argv)
    if args.label is not None and len(args.label) != len(args.run_dirs):
        print(f"error: {len(args.label)} --label for {len(args.run_dirs)} RUN_DIR: give one per RUN_DIR, "
              f"or none", file=sys.stderr)
        return 2
    try:
        if args.label is None:
            runs = [load_run(path) for path in find_runs(args.run_dirs)]
        else:
            # Each RUN_DIR's runs are the seeds of one curve named by its --label, whatever their config.
            runs = [replace(load_run(path), label=label) for arg, label in zip(args.run_dirs, args.label)
                    for path in find_runs([arg])]
        out = plot_runs(runs, args.out, x_axis=args.x)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{out}: {len(runs)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What rendering a DMC frame costs against stepping the task: why pixel envs render at the size
the replay stores instead of rendering large and resizing.

    python benchmarks/render.py
    python benchmarks/render.py --task walker-walk --sizes 64 84 240x320 --json render.json

Times, in one process, --reps rounds of: one control step of the task (its physics substeps,
random actions) and one render per --sizes entry (dm_control's ``physics.render`` on camera 0,
the backend ``MUJOCO_GL`` names or the one the app's probe picks). Prints the median microseconds
of each and each render's ratio to a step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from harness import write_report

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _size(text: str) -> tuple[int, int]:
    height, _, width = text.partition("x")
    return int(height), int(width or height)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="cheetah-run", help="DOMAIN-TASK (default cheetah-run)")
    parser.add_argument("--sizes", nargs="+", type=_size, default=[(64, 64), (240, 320)],
                        help="render sizes, HxW or one number for a square (default 64 240x320)")
    parser.add_argument("--calls", type=int, default=50, help="calls timed per round (default 50)")
    parser.add_argument("--reps", type=int, default=5, help="rounds; medians are reported (default 5)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    return parser.parse_args(argv)


def _seconds_per_call(fn, calls: int) -> float:
    fn()  # warm: the first render creates the GL context
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    from dreamer.envs.rendering import configure_mujoco_gl

    backend = configure_mujoco_gl()
    import numpy as np
    from dm_control import suite

    domain, _, task = args.task.partition("-")
    env = suite.load(domain, task.replace("-", "_"), task_kwargs={"random": 0})
    env.reset()
    spec = env.action_spec()
    rng = np.random.default_rng(0)

    def step():
        if env.step(rng.uniform(spec.minimum, spec.maximum)).last():
            env.reset()

    renders = {f"{h}x{w}": (lambda h=h, w=w: env.physics.render(h, w, camera_id=0)) for h, w in args.sizes}
    rounds: dict[str, list[float]] = {"step": [], **{name: [] for name in renders}}
    for _ in range(args.reps):  # interleaved: a slow spell of the machine hits every figure alike
        rounds["step"].append(_seconds_per_call(step, args.calls))
        for name, render in renders.items():
            rounds[name].append(_seconds_per_call(render, args.calls))
    median_us = {name: statistics.median(times) * 1e6 for name, times in rounds.items()}
    report = {"task": args.task, "mujoco_gl": backend, "median_us": median_us,
              "render_over_step": {name: median_us[name] / median_us["step"] for name in renders}}
    print(f"{args.task}, MUJOCO_GL={backend}: one control step {median_us['step']:.0f} us")
    for name in renders:
        print(f"  render {name}: {median_us[name]:.0f} us ({report['render_over_step'][name]:.0f}x a step)")
    if args.json:
        write_report(args.json, report)
    return report


if __name__ == "__main__":
    main()

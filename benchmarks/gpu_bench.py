"""Seconds per DreamerV3 update on one GPU: our compiled-losses and captured update paths against TorchRL's own
stepper (compiled scan + CUDA graph) at size1m, size12m and size200m, the JAX reference and sheeprl at
size1m where they run, and the first update's time from process start; one command for one device call.

    python3 benchmarks/gpu_bench.py --budget-s 500 --json $OUT/size1m.json                 # size1m, alone
    python3 benchmarks/gpu_bench.py --sizes size12m size200m --budget-s 500 --json $OUT/rest.json  # another call
    python3 benchmarks/gpu_bench.py --sides ours_captured torchrl --dreamerv3-src DIR --json out.json
    python benchmarks/gpu_bench.py --cpu --json out.json    # tiny sizes on the CPU: the paths, not figures

size1m runs alone, in a call of its own (the default --sizes): its sides' cold compiles, side by side with
the JAX and sheeprl sides, take most of one device call. --sides leaves sides out (fewer cold compiles).

Sizes (batch 16 x 64, device=cuda, bf16 autocast and TF32 as the app sets them on a GPU; all with
algo.actor_grad=reinforce, the actor gradient of TorchRL's recipe and of the JAX reference):
  size1m    experiment=gym_state_v3: Pendulum-v1 states
  size12m   experiment=dmc_vision_v3 model=size12m env=pendulum_pixels: 64x64 Pendulum pixels (no dm_control)
  size200m  experiment=dmc_vision_v3 env=pendulum_pixels
--cpu runs tiny_states (alone, as size1m) or tiny_pixels instead (experiment=small at 16 units, batch 2 x 8,
device=cpu, compile.backend=eager: dynamo traces, inductor generates nothing) with every side that runs on a
CPU, so the test suite keeps this script working; its figures mean nothing.

Sides, each in its own process; a size's sides are built side by side (their compile warm-ups overlap:
upper bounds), then timed one at a time in rounds, each round starting at the next side (--warmup untimed
updates, then --reps updates each between two device syncs: seconds per update; then --reps more issued back
to back with one sync at the end, as training issues them: throughput; replay sampling untimed). A side
whose parameters differ from ours by more than 2% (PARAM_TOLERANCE), or whose float32 math settings
(TF32, cudnn.benchmark: harness.math_flags) differ from ours, is not timed: one line says why. TorchRL's
stepper gets our math settings (dreamer.system.device.configure_cuda_math, from our config).
  ours_losses      compile.update=losses (harness.UPDATE_PATH_KEY): world model eager, actor/value losses
                 compiled; before that key exists, today's learner, which is that path
  ours_captured  compile.update=captured: the whole update in CUDA graphs; SKIP on the CPU, and where the
                 config schema lacks the key
  torchrl        DreamerV3OptimizationStepper as TorchRL's recipe builds it with optimization.compile=auto
                 (benchmarks/torchrl_v3.py): on CUDA the whole step compiled around the RSSM scan, captured in
                 a CUDA graph; on the CPU its auto is eager. Same config, parameters printed module by module.
  jax            size1m (tiny_states): danijar/dreamerv3 at e3f02248 from --dreamerv3-src, run by --jax-python
                 (benchmarks/jax_v3.py); SKIP, saying what fails, where its agent does not import
  sheeprl        size1m (tiny_states): benchmarks/peers.py's sheeprl 0.8.4 side, run by --sheeprl-python;
                 SKIP where that Python lacks it
Our replays are filled by random actions (a size200m policy acting on the CPU would take minutes), the
peers' by random play in their own layouts.

First update, after the timings, alone on the machine: `python -m dreamer` at each size as shipped (no
compile.update override), made to stop after its first update (train.train_ratio = one update per
collector batch; train.total_frames covers the prefill and one batch; no videos, no W&B); its
summary.json's first_update_s, from process start to the end of the first update, random phase included.

--budget-s bounds the whole command: a size starts only with --size-min-s left beyond the first-update runs'
reserve (--first-update-reserve-s each); a side not built in time, rounds past that point and first-update
runs that do not fit are skipped, each with a line.

Keys in --json, per size: speedup_vs_torchrl_<size> (torchrl_s / ours as shipped: compile.update as composed
for the device, the fastest of ours where it picks at run time), _losses and _captured, per synced update;
throughput_vs_torchrl_<size> the same from the back-to-back seconds; speedup_captured_vs_losses_<size>;
first_update_s_<size>; speedup_vs_jax_<size> and speedup_vs_sheeprl_<size> at size1m (tiny_states). "sizes"
holds each side's medians (s_per_update synced, back_to_back_s, updates_per_s), parameters, math settings,
build and warm-up seconds and per-round figures, and each round's order; "skips" one line per thing that
did not run, with its reason. A speedup is the median over rounds of the per-round ratio, null where its two
sides did not both run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax_v3
import peers
import torchrl_v3
from harness import (
    REPO,
    SideFailed,
    SideProcess,
    SideTimeout,
    build_ours,
    compose,
    serve,
    shipped_update_path,
    update_path_overrides,
    write_report,
)

SCRIPT = Path(__file__).resolve()
PENDULUM_PIXELS = ["env=pendulum_pixels", "env.name=Pendulum-v1"]
SIZES = {
    "size1m": ["experiment=gym_state_v3", "algo.actor_grad=reinforce", "device=cuda"],
    "size12m": ["experiment=dmc_vision_v3", "model=size12m", *PENDULUM_PIXELS, "algo.actor_grad=reinforce",
                "device=cuda"],
    "size200m": ["experiment=dmc_vision_v3", *PENDULUM_PIXELS, "algo.actor_grad=reinforce", "device=cuda"],
}
TINY = ["algo.actor_grad=reinforce", "buffer.batch_size=2", "buffer.batch_length=8", "algo.hidden_dim=16",
        "algo.rssm_hidden_dim=16", "algo.num_categoricals=4", "algo.num_classes=4", "algo.num_bins=15",
        "algo.imagination_horizon=3", "algo.encoder_channels=4", "compile.backend=eager", "device=cpu"]
CPU_SIZES = {
    "tiny_states": ["experiment=small", *TINY],
    "tiny_pixels": ["experiment=small", *PENDULUM_PIXELS, *TINY],
}
REFERENCE_SIZE = {"cuda": "size1m", "cpu": "tiny_states"}  # where the JAX and sheeprl sides run; alone in a call
OUR_PATHS = {"losses": "ours_losses", "captured": "ours_captured"}
SIDES = (*OUR_PATHS.values(), "torchrl", "jax", "sheeprl")
# Sides of one comparison hold the same model: their parameter counts agree within this fraction.
PARAM_TOLERANCE = 0.02
# A side that says nothing for this long is hung (the budget usually cuts sooner).
SIDE_TIMEOUT_S = 1200
FIRST_UPDATE_TIMEOUT_S = 300


class Budget:
    """The command's deadline, and the seconds kept back for the first-update runs."""

    def __init__(self, seconds: float, reserve_s: float):
        self.end, self.reserve_s = time.monotonic() + seconds, reserve_s

    def left(self) -> float:
        return self.end - time.monotonic()

    def for_timings(self) -> float:
        return self.left() - self.reserve_s


# -- one size's sides ----------------------------------------------------------------------------------------
def plan(size: str, overrides: list[str], args, cache_dir: str) -> tuple[dict, dict]:
    """({side: (python, spec, extra environment)}, {side: why it does not run here}) at ``size``."""
    cfg = compose(overrides)
    cuda = cfg.device.startswith("cuda")
    b = cfg.buffer
    fill = args.fill_steps or max(2 * b.batch_size * b.batch_length, 256)
    plans, skips = {}, {}
    for path, side in OUR_PATHS.items():
        extra, why = update_path_overrides(path)
        if path == "captured" and not cuda:
            why = "CUDA graphs need CUDA: the captured path runs on a GPU only"
        if why:
            skips[side] = why
            continue
        # The replay holds what it is filled with: no preset-sized page-locked storage per side (and no
        # random prefill to hold: the fill is random play already).
        spec = {"kind": "ours", "overrides": [*overrides, *extra, f"compile.cache_dir={cache_dir}/{side}",
                                              f"buffer.capacity={fill}", "collector.init_random_frames=0"],
                "fill_steps": fill, "random_actions": True}
        plans[side] = (sys.executable, spec, {})
    # TorchRL's auto: compiled and captured on CUDA, eager elsewhere.
    recipe = torchrl_v3.recipe_config(cfg, compiled=cuda, cuda=cuda)
    plans["torchrl"] = (sys.executable, {"kind": "torchrl", "device": cfg.device, "fill_steps": fill,
                                         "recipe": recipe, "cuda_fast_math": cfg.cuda_fast_math},
                        {"TORCHINDUCTOR_CACHE_DIR": f"{cache_dir}/torchrl"})
    if size == REFERENCE_SIZE["cuda" if cuda else "cpu"]:
        if why := jax_v3.problem(args.jax_python, args.dreamerv3_src):
            skips["jax"] = why
        else:
            src = str(Path(args.dreamerv3_src).resolve())
            path = os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))
            plans["jax"] = (args.jax_python, jax_v3.side_spec(overrides, src), {"PYTHONPATH": path})
        if why := peers.sheeprl_problem(args.sheeprl_python, alternative=""):
            skips["sheeprl"] = why.removeprefix("error: ")
        else:
            rows = peers.mapping(cfg, args.threads or os.cpu_count())
            plans["sheeprl"] = (args.sheeprl_python, {"kind": "sheeprl",
                                                      "sheeprl_overrides": peers.sheeprl_overrides(rows)}, {})
    left_out = {side: "left out by --sides" for side in [*plans, *skips] if side not in args.sides}
    plans = {side: p for side, p in plans.items() if side in args.sides}
    skips = {side: why for side, why in skips.items() if side in args.sides}
    return plans, {**skips, **left_out}


def start_and_build(plans: dict, args, budget: Budget, skip) -> dict[str, SideProcess]:
    """Start every side at once, wait for each build within the budget; the sides that built."""
    procs = {}
    for side, (python, spec, env) in plans.items():
        threads = None if spec["kind"] == "jax" else args.threads  # torch's threads; JAX's Python has no torch
        procs[side] = SideProcess(side, python, SCRIPT, {**spec, "threads": threads}, threads=threads,
                                  env={"SDL_VIDEODRIVER": "dummy", **env}, timeout_s=SIDE_TIMEOUT_S)
    for side, proc in list(procs.items()):
        try:
            info = proc.built(timeout_s=budget.for_timings())
        except SideTimeout:
            skip(side, "not built within --budget-s")
            del procs[side]
            continue
        except SideFailed as err:
            print(err, file=sys.stderr)
            skip(side, f"failed to build: {str(err).splitlines()[-1]}")
            del procs[side]
            continue
        warm = info["compile_warmup_s"]
        print(f"  built {side} in {info['build_s']:.1f} s" + (f" (warm-up {warm:.1f} s)" if warm is not None else ""),
              flush=True)
    return procs


def refusals(infos: dict[str, dict]) -> dict[str, str]:
    """{side: why it is not timed}: sides whose parameters differ from ours by more than PARAM_TOLERANCE, or
    whose math settings (where a side reports them) differ from ours. Nothing to refuse without our side."""
    ours = next((side for side in OUR_PATHS.values() if side in infos), None)
    if ours is None:
        return {}
    reference = sum(infos[ours]["params"].values())
    refused = {}
    for side, info in infos.items():
        total = sum(info["params"].values())
        if abs(total - reference) > PARAM_TOLERANCE * reference:
            refused[side] = (f"{total:,} parameters against {ours}'s {reference:,} ({total / reference - 1:+.1%}, "
                             f"more than {PARAM_TOLERANCE:.0%} apart): not the same model, not timed")
        elif info.get("math") is not None and info["math"] != infos[ours]["math"]:
            refused[side] = f"math settings {info['math']} against {ours}'s {infos[ours]['math']}: not timed"
    return refused


def round_order(sides: list[str], r: int) -> list[str]:
    """Round ``r``'s order: the sides rotated by ``r``, so each side opens a round in turn (with two sides,
    the order alternates)."""
    shift = r % len(sides) if sides else 0
    return sides[shift:] + sides[:shift]


def time_rounds(procs: dict[str, SideProcess], args, budget: Budget, skip) -> tuple[dict[str, list[dict]], list]:
    """Rounds (at least one) in rotating order, until --rounds or the budget's share for timings is spent:
    ({side: each round's figures}, each round's order)."""
    sides = list(procs)
    rounds = {side: [] for side in sides}
    orders = []
    print(f"  {'round':>5}" + "".join(f"{s + ' s (synced/b2b)':>28}" for s in sides))
    for r in range(args.rounds):
        if r > 0 and budget.for_timings() <= 0:
            skip("rounds", f"{args.rounds - r} of {args.rounds} rounds cut by --budget-s")
            break
        order = [side for side in round_order(sides, r) if side in procs]
        orders.append(order)
        for side in order:
            try:
                rounds[side].append(procs[side].time(args.warmup, args.reps, back_to_back=True))
            except SideFailed as err:
                print(err, file=sys.stderr)
                skip(side, f"failed while timed: {str(err).splitlines()[-1]}")
                del procs[side], rounds[side]
        print(f"  {r:>5}" + "".join(f"{rounds[s][-1]['wall_s']:>17.4f} / {rounds[s][-1]['back_to_back_s']:.4f}"
                                    if rounds.get(s) else f"{'-':>28}" for s in sides), flush=True)
    return rounds, orders


def shipped_side(cfg, rounds: dict) -> tuple[str | None, str]:
    """Our side that ``python -m dreamer`` runs at ``cfg``, and how it was chosen."""
    path = shipped_update_path(cfg)
    if path in OUR_PATHS:
        return OUR_PATHS[path], f"{path} (as composed)"
    ours = [side for side in OUR_PATHS.values() if rounds.get(side)]
    if path == "eager" or not ours:
        return None, f"{path}: no side here"
    fastest = min(ours, key=lambda side: statistics.median(r["wall_s"] for r in rounds[side]))
    return fastest, f"{path} picks at run time: the fastest of ours measured, {fastest}"


def speedup(rounds: dict, ours: str | None, other: str, figure: str = "wall_s") -> float | None:
    """Median over rounds of other's / ours' ``figure`` (seconds); None where either did not run."""
    if not rounds.get(ours) or not rounds.get(other):
        return None
    return statistics.median(o[figure] / u[figure] for o, u in zip(rounds[other], rounds[ours]))


def run_size(size: str, overrides: list[str], args, budget: Budget, skip) -> dict:
    print(f"\n== {size}: ours {' '.join(overrides)}", flush=True)
    cfg = compose(overrides)
    with tempfile.TemporaryDirectory(prefix="gpu_bench_inductor_") as cache_dir:
        plans, skips = plan(size, overrides, args, cache_dir)
        for side, why in skips.items():
            skip(side, why)
        if "torchrl" in plans:
            for line in torchrl_v3.describe(plans["torchrl"][1]["recipe"]):
                print(f"  torchrl recipe {line}")
        procs, rounds, orders = {}, {}, []
        try:
            procs = start_and_build(plans, args, budget, skip)
            infos = {side: proc.info for side, proc in procs.items()}
            if infos:
                peers.print_params({side: info["params"] for side, info in infos.items()})
                for side, info in infos.items():
                    print(f"  math {side}: {info.get('math') or 'not set by this benchmark'}")
            for side, why in refusals(infos).items():
                skip(side, why)
                procs.pop(side).stop()
            if procs:
                rounds, orders = time_rounds(procs, args, budget, skip)
        finally:
            for proc in procs.values():
                proc.stop()
    shipped, how = shipped_side(cfg, rounds)
    sides = {}
    for side in rounds:
        if rounds[side]:
            back_to_back = statistics.median(r["back_to_back_s"] for r in rounds[side])
            sides[side] = {**infos[side], "s_per_update": statistics.median(r["wall_s"] for r in rounds[side]),
                           "back_to_back_s": back_to_back, "updates_per_s": 1.0 / back_to_back,
                           "cpu_s": statistics.median(r["cpu_s"] for r in rounds[side]), "rounds": rounds[side]}
    return {
        "overrides": overrides, "shipped": how, "sides": sides, "orders": orders,
        "speedup_vs_torchrl": speedup(rounds, shipped, "torchrl"),
        "speedup_vs_torchrl_losses": speedup(rounds, "ours_losses", "torchrl"),
        "speedup_vs_torchrl_captured": speedup(rounds, "ours_captured", "torchrl"),
        "throughput_vs_torchrl": speedup(rounds, shipped, "torchrl", "back_to_back_s"),
        "speedup_captured_vs_losses": speedup(rounds, "ours_captured", "ours_losses"),
        "speedup_vs_jax": speedup(rounds, shipped, "jax"), "speedup_vs_sheeprl": speedup(rounds, shipped, "sheeprl"),
    }


# -- the first update, as a user gets it -------------------------------------------------------------------
def first_update(size: str, overrides: list[str], timeout_s: float, workdir: Path) -> tuple[float | None, str]:
    """(seconds from process start to the end of the first update of ``python -m dreamer`` at ``overrides``,
    how it went): the run stops after the collector batch that brought its first update."""
    from dreamer.config.ratio import TrainRatio
    from dreamer.config.validate import steps_before_learning

    cfg = compose(overrides)
    one_update_per_batch = TrainRatio.of(cfg).replayed_per_update / cfg.collector.frames_per_batch
    # The shortest run the config checks allow: the prefill, then the batch that brings the first update.
    total_frames = cfg.env.action_repeat * (steps_before_learning(cfg) + cfg.collector.frames_per_batch)
    run_dir = workdir / f"first_update_{size}"
    cmd = [sys.executable, "-m", "dreamer", f"hydra.run.dir={run_dir}", *overrides,
           f"train.train_ratio={one_update_per_batch}",
           f"train.total_frames={total_frames}", "eval.episodes=1", "eval.video=false", "eval.openloop=false",
           "eval.every=1000000", "checkpoint.every=1000000", "logger.backend=none", "logger.progress_bar=false"]
    env = {**os.environ, "SDL_VIDEODRIVER": "dummy", "PYTHONUNBUFFERED": "1"}
    with open(workdir / f"first_update_{size}.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    summary = run_dir / "summary.json"
    seconds = json.loads(summary.read_text()).get("first_update_s") if summary.exists() else None
    if seconds is not None:
        return seconds, f"exit {proc.returncode}"
    tail = (workdir / f"first_update_{size}.log").read_text().strip().splitlines()[-1:] or ["no output"]
    ended = f"cut after {timeout_s:.0f} s" if proc.returncode < 0 else f"exit {proc.returncode}"
    return None, f"no first update ({ended}): {tail[0][:300]}"


# -- the command -----------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU (what the test suite runs)")
    parser.add_argument("--sizes", nargs="+",
                        help="which sizes (default: size1m, or tiny_states with --cpu, which run alone)")
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES),
                        help="which sides (default: every side that runs here)")
    parser.add_argument("--budget-s", type=float,
                        help="the whole command's seconds (default 500; with --cpu 1200, a safety net only)")
    parser.add_argument("--size-min-s", type=float, default=60, help="start a size only with this much left (60)")
    parser.add_argument("--first-update-reserve-s", type=float, default=60,
                        help="seconds kept back for each first-update run (default 60); 0 with --no-first-update")
    parser.add_argument("--no-first-update", action="store_true", help="skip the python -m dreamer runs")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each opened by the next side (default 3)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed updates per side and round (default 5)")
    parser.add_argument("--reps", type=int, default=20, help="timed updates per side and round (default 20)")
    parser.add_argument("--threads", type=int, help="torch threads per side (default: torch's; 1 with --cpu)")
    parser.add_argument("--fill-steps", type=int, help="random steps in every replay (default 2 batches, >= 256)")
    parser.add_argument("--dreamerv3-src", help="a checkout of danijar/dreamerv3 at e3f02248 (the JAX side)")
    parser.add_argument("--jax-python", default=sys.executable, help="the Python with JAX (default: this one)")
    parser.add_argument("--sheeprl-python", default=sys.executable, help="the Python with sheeprl (default: this)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--serve", help=argparse.SUPPRESS)  # internal: run one side
    args = parser.parse_args(argv)
    table = CPU_SIZES if args.cpu else SIZES
    alone = REFERENCE_SIZE["cpu" if args.cpu else "cuda"]
    args.sizes = args.sizes or [alone]
    if unknown := [s for s in args.sizes if s not in table]:
        mode = "--cpu" if args.cpu else "the GPU"
        parser.error(f"--sizes {' '.join(unknown)}: {mode} sizes are {', '.join(table)}")
    if alone in args.sizes and len(set(args.sizes)) > 1:
        parser.error(f"--sizes: {alone} runs alone (its sides' cold compiles take most of a call): "
                     f"give it a call of its own, the other sizes another")
    if min(args.rounds, args.reps, args.threads or 1, args.fill_steps or 1) < 1 or args.warmup < 0:
        parser.error("--rounds, --reps, --threads and --fill-steps must be >= 1, --warmup >= 0")
    if args.cpu and args.threads is None:
        args.threads = 1
    if args.budget_s is None:
        args.budget_s = 1200 if args.cpu else 500
    return args


def cuda_problem() -> str | None:
    import torch

    return None if torch.cuda.is_available() else "no CUDA device here: run with --cpu for the tiny CPU sizes"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve:
        return serve({"ours": build_ours, "torchrl": torchrl_v3.build_torchrl, "jax": jax_v3.build_jax,
                      "sheeprl": peers.build_sheeprl}, json.loads(args.serve))
    if not args.cpu and (problem := cuda_problem()):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    table = CPU_SIZES if args.cpu else SIZES
    runs_first_update = not args.no_first_update
    budget = Budget(args.budget_s, args.first_update_reserve_s * len(args.sizes) * runs_first_update)
    skips: list[str] = []

    def skip(where: str, why: str) -> None:
        skips.append(f"{where}: {why}")
        print(f"  SKIP {where}: {why}", flush=True)

    results: dict = {"mode": "cpu" if args.cpu else "cuda", "budget_s": args.budget_s, "rounds": args.rounds,
                     "warmup": args.warmup, "reps": args.reps, "sizes": {}, "first_update": {}}
    for size in table:
        for key in ("speedup_vs_torchrl_{}", "speedup_vs_torchrl_{}_losses", "speedup_vs_torchrl_{}_captured",
                    "throughput_vs_torchrl_{}", "speedup_captured_vs_losses_{}", "first_update_s_{}"):
            results[key.format(size)] = None
    reference = REFERENCE_SIZE[results["mode"]]
    results[f"speedup_vs_jax_{reference}"] = results[f"speedup_vs_sheeprl_{reference}"] = None

    for size in args.sizes:
        if budget.for_timings() < args.size_min_s:
            skip(size, f"{max(budget.for_timings(), 0):.0f} s of --budget-s left for timings, a size needs "
                       f"--size-min-s {args.size_min_s:.0f}")
            continue
        r = results["sizes"][size] = run_size(size, table[size], args, budget,
                                              lambda where, why, s=size: skip(f"{s} {where}", why))
        for variant in ("", "_losses", "_captured"):
            results[f"speedup_vs_torchrl_{size}{variant}"] = r[f"speedup_vs_torchrl{variant}"]
        results[f"speedup_captured_vs_losses_{size}"] = r["speedup_captured_vs_losses"]
        results[f"throughput_vs_torchrl_{size}"] = r["throughput_vs_torchrl"]
        if size == reference:
            results[f"speedup_vs_jax_{size}"], results[f"speedup_vs_sheeprl_{size}"] = \
                r["speedup_vs_jax"], r["speedup_vs_sheeprl"]

    if runs_first_update:
        print("\n== first update from process start (python -m dreamer, as shipped)", flush=True)
        with tempfile.TemporaryDirectory(prefix="gpu_bench_first_update_") as workdir:
            for size in args.sizes:
                if budget.left() < 10:
                    skip(f"{size} first update", f"{max(budget.left(), 0):.0f} s of --budget-s left")
                    continue
                seconds, how = first_update(size, table[size], min(budget.left(), FIRST_UPDATE_TIMEOUT_S),
                                            Path(workdir))
                results["first_update"][size] = {"first_update_s": seconds, "run": how}
                results[f"first_update_s_{size}"] = seconds
                if seconds is None:
                    skip(f"{size} first update", how)
                else:
                    print(f"  {size}: first update {seconds:.1f} s after process start ({how})", flush=True)
    else:
        skip("first update", "--no-first-update")

    results["skips"] = skips
    print()
    for key, value in results.items():
        if key.startswith(("speedup_", "throughput_", "first_update_s_")):
            print(f"  {key}: {'-' if value is None else f'{value:.2f}'}")
    write_report(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

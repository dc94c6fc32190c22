"""Compile cache: time from process start to the first compiled update, cold vs warm.

Each measurement is a fresh Python process (``--child``) that imports
dreamer, builds the learner of an experiment preset, fills a replay buffer
with random-policy steps, compiles and warms the actor/value losses as the
app does (``DreamerV1Learner.compile`` + ``warmup``) and runs one update.
The parent times the process from launch to that first update. Per
repetition, three processes:

- cold:          an empty ``compile.cache_dir``; it saves its portable artifact
                 (``torch.compiler.save_cache_artifacts``), as every run does;
- warm_dir:      the same cache dir again, now populated (a restart on the
                 same machine, or a cache dir copied to another one);
- warm_artifact: a new empty cache dir plus ``compile.cache_artifact`` = the
                 cold run's file (what another machine gets from one file).

``warm_vs_cold`` = median cold / median warm_dir; ``artifact_vs_cold`` the
same for warm_artifact.

    python benchmarks/compile_cache.py --json out.json

Where a start's time goes: run one child by hand with ``BENCH_COMPILE_TIMES=1``
(it prints dynamo's ``compile_times()`` and the dynamo / AOTAutograd / inductor
counters: graphs traced, AOTAutograd cache hits and bypasses, FX-graph hits):

    BENCH_COMPILE_TIMES=1 python benchmarks/compile_cache.py --child \
        --experiment small_v1 --cache-dir DIR
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

REPO = Path(__file__).resolve().parents[1]


def child(experiment: str, cache_dir: str, artifact: str | None, save_to: str | None) -> None:
    """One process start -> first compiled update (run with --child)."""
    import torch
    from hydra import compose, initialize_config_dir

    from dreamer.algos.registry import algorithm
    from dreamer.config import load_config, register_configs
    from dreamer.config.location import conf_dir
    from dreamer.data.replay import make_replay_buffer, write
    from dreamer.envs.factory import close_env, make_env
    from dreamer.envs.rendering import configure_mujoco_gl
    from dreamer.system import compile_cache

    register_configs()
    # compile=on: a preset that ships eager is measured as compile=on runs it.
    overrides = [f"experiment={experiment}", "compile=on", f"compile.cache_dir={cache_dir}", "buffer.prefetch=0"]
    if artifact:
        overrides.append(f"compile.cache_artifact={artifact}")
    with initialize_config_dir(str(conf_dir()), version_base="1.3"):
        cfg = load_config(compose("config", overrides=overrides))
    configure_mujoco_gl()
    torch.manual_seed(cfg.seed)
    compile_cache.use_cache_dir(cfg.compile)
    if artifact:
        compile_cache.load_artifact(Path(artifact))
    build_models, learner_cls = algorithm(cfg.algo.name)
    env = make_env(cfg.env, cfg.algo, seed=cfg.seed)
    models = build_models(cfg.algo, cfg.env, env, torch.device("cpu"))
    replay = make_replay_buffer(cfg.buffer, torch.device("cpu"))
    steps = 0
    while steps < 2 * cfg.buffer.batch_size * cfg.buffer.batch_length:
        rollout = env.rollout(cfg.env.max_episode_steps, break_when_any_done=True)
        rollout["collector", "traj_ids"] = torch.full(rollout.shape, steps, dtype=torch.int64)
        steps += write(replay, rollout, models.obs_key)
    close_env(env)
    learner = learner_cls(cfg.algo, cfg.compile, models, torch.device("cpu"),
                          batch_size=cfg.buffer.batch_size, batch_length=cfg.buffer.batch_length)
    learner.compile()
    setup_done = time.time()
    learner.warmup(replay.sample())
    warm_done = time.time()
    if os.environ.get("BENCH_COMPILE_TIMES"):
        print(torch._dynamo.utils.compile_times(), file=sys.stderr)
        for group in ("stats", "aot_autograd", "inductor"):
            print(group, dict(torch._dynamo.utils.counters[group]), file=sys.stderr)
    learner.update(replay.sample())
    done_at = time.time()
    if save_to:
        compile_cache.save_artifact(Path(save_to))
    print(json.dumps({"first_update_at": done_at, "setup_done_at": setup_done,
                      "warmup_s": warm_done - setup_done, "update_s": done_at - warm_done}))


def measure(experiment: str, cache_dir: Path, artifact: Path | None, save_to: Path | None) -> float:
    cmd = [sys.executable, __file__, "--child", "--experiment", experiment, "--cache-dir", str(cache_dir)]
    if artifact:
        cmd += ["--artifact", str(artifact)]
    if save_to:
        cmd += ["--save-to", str(save_to)]
    env = {**os.environ, "SDL_VIDEODRIVER": "dummy", "PYTHONPATH": str(REPO)}
    start = time.time()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    if out.returncode != 0:
        sys.exit(f"child failed:\n{out.stderr[-3000:]}")
    last = json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])
    print(f"      start->setup {last['setup_done_at'] - start:.1f} s, warm-up {last['warmup_s']:.1f} s, "
          f"first update {last['update_s']:.1f} s", file=sys.stderr)
    return last["first_update_at"] - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", default="small_v1",
                        help="experiment preset to compile (small_v1: the V1 settings measured in docs/PERFORMANCE.md)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", help=argparse.SUPPRESS)
    parser.add_argument("--artifact", help=argparse.SUPPRESS)
    parser.add_argument("--save-to", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.experiment, args.cache_dir, args.artifact, args.save_to)
        return

    times: dict[str, list[float]] = {"cold": [], "warm_dir": [], "warm_artifact": []}
    print(f"{'rep':>4} {'cold s':>8} {'warm_dir s':>11} {'warm_artifact s':>16}")
    with tempfile.TemporaryDirectory(prefix="compile-cache-bench-") as tmp:
        for rep in range(args.reps):
            root = Path(tmp) / str(rep)
            shared, fresh, run_dir = root / "cache", root / "fresh", root / "run"
            run_dir.mkdir(parents=True)
            times["cold"].append(measure(args.experiment, shared, None, run_dir))
            times["warm_dir"].append(measure(args.experiment, shared, None, None))
            artifact = run_dir / "compile_cache.bin"
            times["warm_artifact"].append(measure(args.experiment, fresh, artifact, None))
            print(f"{rep:>4} {times['cold'][-1]:>8.1f} {times['warm_dir'][-1]:>11.1f} "
                  f"{times['warm_artifact'][-1]:>16.1f}")
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "experiment": args.experiment,
        "reps": args.reps,
        **{f"{k}_s": v for k, v in med.items()},
        "per_rep": times,
        "warm_vs_cold": med["cold"] / med["warm_dir"],
        "artifact_vs_cold": med["cold"] / med["warm_artifact"],
    }
    print(f"\nmedian: cold {med['cold']:.1f} s, warm_dir {med['warm_dir']:.1f} s, "
          f"warm_artifact {med['warm_artifact']:.1f} s")
    print(f"warm_vs_cold {result['warm_vs_cold']:.2f}x, artifact_vs_cold {result['artifact_vs_cold']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

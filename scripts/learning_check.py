"""Does a preset learn? Train it for a wall-clock budget per seed and check the eval return.

One preset:
    python scripts/learning_check.py                                  # experiment=small, 3 seeds x 30 min, >= -400
    python scripts/learning_check.py --experiment small_v1 --minutes 30 --threshold -400 --seeds 0
    python scripts/learning_check.py --check runs/small/seed_0 ...    # judge finished runs again
    python scripts/learning_check.py --seeds 0 -- algo.actor_lr=1e-4  # extra Hydra overrides after --

A suite: fixed presets on many tasks (SUITES below; docs/LEARNING.md):
    python scripts/learning_check.py --suite cpu                      # every task x seed x budget: ~15.5 hours
    python scripts/learning_check.py --suite cpu --tasks cartpole_v3  # some of its tasks
    python scripts/learning_check.py --suite cpu --check outputs/learning_suite/cpu   # judge finished runs again
    python scripts/learning_check.py --suite ci                       # every task for seconds, tiny (CI)
    python scripts/learning_check.py --suite cpu --random-levels 20   # each task's random-policy return

Seeds run one after another (each has the machine to itself, as the budget
assumes): `python -m dreamer experiment=E seed=S train.max_minutes=M
eval.episodes=N hydra.run.dir=OUT/seed_S` (a suite adds its task's env
overrides and runs in OUT/TASK/seed_S). A seed passes when an evaluation that
finished inside the budget (its ``wall_s``, counted as train.max_minutes
counts: from the start of building the run, after imports) has a mean return of at least the threshold; a task without a
threshold is reported, not judged (its seeds pass when they finish and
evaluate). One preset: prints a table, writes ``OUT/learning_check.json`` and
``OUT/learning_curve.png`` (eval return against wall-clock minutes, mean ± std
over seeds); exits 1 when fewer than --min-pass seeds pass (default: all). A
suite: writes ``OUT/learning_suite.json``, the table as ``OUT/learning_suite.md``
and ``OUT/TASK.png`` per task (eval return against wall-clock minutes and
against env frames, mean ± std over seeds, the random-policy level and the
threshold drawn); exits 1 when a task misses its threshold on more seeds than
it allows. A suite run that finds a seed already finished in OUT (its
summary.json) judges it instead of training it again, so the same command
continues an interrupted suite. Bad input: one ``error:`` line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from dreamer.errors import UserError
from dreamer.report.eval_metrics import eval_return

REPO = Path(__file__).resolve().parents[1]

# A run finishes its last collector batch, final evaluation and checkpoint after
# the budget; past this many extra seconds it is considered hung.
GRACE_S = 600
# Every launched run's own overrides (beside its run directory): the log is a file, not a terminal.
LAUNCH_OVERRIDES = ("logger.progress_bar=false",)


# -- suites: one preset per algorithm, fixed across tasks --------------------------------


@dataclass(frozen=True)
class Task:
    """One row of a suite. Between the tasks of one preset only ``env`` differs."""

    name: str
    experiment: str  # the preset (conf/experiment/), the same for every task of its algorithm
    env: tuple[str, ...]  # env= / env.name= overrides: the task
    minutes: float  # wall-clock budget per seed (train.max_minutes: from the start of building the run)
    threshold: float | None  # eval mean to reach inside the budget; None: reported, no bar
    threshold_source: str
    episodes: int  # episodes per evaluation
    seeds: tuple[int, ...]
    allowed_misses: int  # seeds that may miss the threshold with the task still passing
    random_return: float  # mean return of uniformly random actions, on the eval's episodes
    random_source: str
    budget_source: str = "issue 18"  # why this budget: a budget moves only with a measured argument
    # Updates between evaluations when the preset's own cadence (a published one: tens of thousands)
    # would leave the budget with none but the last; how often it is scored, not how it learns.
    eval_every: int | None = None

    def overrides(self) -> list[str]:
        """The task's own overrides: its env, and its evaluation cadence when it sets one."""
        return [*self.env, *([f"eval.every={self.eval_every}"] if self.eval_every else [])]


@dataclass(frozen=True)
class Suite:
    name: str
    about: str
    tasks: tuple[Task, ...]
    overrides: tuple[str, ...]  # added to every run of the suite (after the task's, before the user's)


# Random-policy returns: `python scripts/learning_check.py --suite cpu --random-levels 20`
# (20 episodes of uniformly random actions through the run's own env: its action
# repeat and episode limit; docs/LEARNING.md).
def _measured(std: float) -> str:
    return f"measured: --random-levels 20 (20 episodes, seed 0; std {std:g})"


_PENDULUM_RANDOM = {"random_return": -1260.0, "random_source": _measured(262)}
_DMC_BAR = "issue 18 (DMC returns reach 1000)"
# Cartpole acts at PlaNet's action repeat for the domain (Hafner et al. 2019: 8), the env's
# own setting, as issue 18 allows: at DreamerV3's repeat 2 too few env frames per minute
# reach a CPU run for cartpole-balance to reach its bar inside the budget. Reacher stays at
# 2: at PlaNet's 4 it missed its bar. The runs behind both: docs/LEARNING.md.
_CARTPOLE = "env.action_repeat=8"
# Random-policy returns at that action repeat (--random-levels 20):
RANDOM_BALANCE, RANDOM_BALANCE_STD = 270.0, 46.5
RANDOM_SWINGUP, RANDOM_SWINGUP_STD = 119.0, 63.6
RANDOM_ACROBOT, RANDOM_ACROBOT_STD = -436.3, 72.2  # at action repeat 4

CPU = Suite(
    name="cpu",
    about="2-core CPU, one run at a time: experiment=small (V3), small_v1 (V1) and gym_state_v3 (V3's published "
          "proprio setting), each fixed across tasks",
    tasks=(
        Task(name="pendulum_v3", experiment="small", env=("env=pendulum",), minutes=30,
             threshold=-400.0, threshold_source="issue 18 (a good swing-up: about -150)",
             episodes=10, seeds=(0, 1, 2), allowed_misses=0, **_PENDULUM_RANDOM),
        Task(name="pendulum_v1", experiment="small_v1", env=("env=pendulum",), minutes=30,
             threshold=-400.0, threshold_source="issue 18, as for V3",
             episodes=10, seeds=(0, 1, 2), allowed_misses=0, **_PENDULUM_RANDOM),
        Task(name="cartpole_v3", experiment="small", env=("env=gym", "env.name=CartPole-v1"), minutes=30,
             threshold=400.0,
             threshold_source="80% of CartPole-v1's maximum 500 (its time limit; gymnasium's 'solved' is 475)",
             episodes=10, seeds=(0, 1, 2), allowed_misses=0, random_return=20.0, random_source=_measured(14)),
        # Issue 55's rows: a discrete task decided at its terminal (Acrobot: -1 a step until the
        # tip swings above the bar, which ends the episode), and CartPole under DreamerV3's own
        # proprio setting (gym_state_v3: 64-step sequences; random episodes last ~22 steps).
        # Acrobot at action repeat 4: at 1, random actions never reached the goal in 500 steps (0 of
        # 20 episodes), so nothing would ever show the world model a terminal; at 4, 7 of 20 did.
        Task(name="acrobot_v3", experiment="small", env=("env=gym", "env.name=Acrobot-v1", "env.action_repeat=4"),
             minutes=60, threshold=-150.0, threshold_source="issue 55: the goal inside 150 env steps (random "
             "play mostly hits the 500-step limit)", episodes=10, seeds=(0, 1), allowed_misses=0,
             random_return=RANDOM_ACROBOT, random_source=_measured(RANDOM_ACROBOT_STD), budget_source="issue 55"),
        Task(name="cartpole_gym_state_v3", experiment="gym_state_v3", env=("env.name=CartPole-v1",), minutes=60,
             threshold=400.0, threshold_source="as cartpole_v3", episodes=10, seeds=(0, 1), allowed_misses=0,
             random_return=20.0, random_source=_measured(14), budget_source="issue 55", eval_every=500),
        Task(name="dmc_cartpole_balance_v3", experiment="small",
             env=("env=dmc_proprio", "env.name=cartpole-balance", _CARTPOLE), minutes=30,
             threshold=800.0, threshold_source=_DMC_BAR,
             episodes=5, seeds=(0, 1), allowed_misses=0, random_return=RANDOM_BALANCE,
             random_source=_measured(RANDOM_BALANCE_STD)),
        Task(name="dmc_reacher_easy_v3", experiment="small",
             env=("env=dmc_proprio", "env.name=reacher-easy"), minutes=60,
             threshold=600.0, threshold_source=_DMC_BAR,
             episodes=5, seeds=(0, 1), allowed_misses=0, random_return=49.0, random_source=_measured(57)),
        Task(name="pendulum_pixels_v3", experiment="small", env=("env=pendulum_pixels",), minutes=60,
             threshold=-400.0, threshold_source="issue 18, as from states",
             episodes=10, seeds=(0, 1), allowed_misses=0, **_PENDULUM_RANDOM),
        Task(name="dmc_cartpole_swingup_pixels_v3", experiment="small",
             env=("env=dmc", "env.name=cartpole-swingup", _CARTPOLE), minutes=120,
             threshold=None, threshold_source="none: a rising curve is reported (issue 18)",
             episodes=5, seeds=(0,), allowed_misses=0, random_return=RANDOM_SWINGUP,
             random_source=_measured(RANDOM_SWINGUP_STD)),
    ),
    # Only the clock ends a run (the presets' own total_frames are for everyday use).
    overrides=("train.total_frames=1000000000",),
)

CI_MINUTES = 3.0
# Every cpu task for a few seconds at toy sizes: each run builds its env and
# model, collects, makes a few updates, evaluates and finishes; the judging,
# table, figures and exit codes run as for the real suite. No task has a bar.
CI = Suite(
    name="ci",
    about="the cpu suite's tasks at toy sizes for a few seconds each: the pipeline, not learning",
    # The clock is a safety net here (each run ends by its frames in seconds): it must not end
    # a run that a busy machine slowed.
    tasks=tuple(replace(t, minutes=CI_MINUTES, threshold=None, threshold_source="none (ci: the run must finish)",
                        budget_source="ci: toy sizes for seconds",
                        episodes=1, seeds=(0,), allowed_misses=0) for t in CPU.tasks),
    overrides=(
        # Ends each run first: 24 agent steps at action repeat 8 (cartpole), 96 at 2, 192 at 1.
        "train.total_frames=192",
        # One learner thread: tiny updates gain nothing from two, and on a busy
        # machine two OpenMP threads waiting on each other slow them by orders of magnitude.
        "threads=1", "compile=off", "collector.num_workers=0", "collector.init_random_frames=16",
        "collector.frames_per_batch=8", "buffer.capacity=1000", "buffer.batch_size=2", "buffer.batch_length=8",
        "train.train_ratio=4",  # a quarter update per agent step at 2 x 8: 2-44 updates per run
        "env.max_episode_steps=16", "algo.hidden_dim=16", "algo.rssm_hidden_dim=16",
        "algo.encoder_channels=4", "algo.imagination_horizon=3", "eval.every=2", "eval.openloop=false",
        "logger.log_every=2", "checkpoint.every=1000",
    ),
)

SUITES = {s.name: s for s in (CPU, CI)}


def suite_by_name(name: str, tasks: list[str] | None) -> Suite:
    if name not in SUITES:
        raise UserError(f"unknown suite {name!r}; choose one of: {', '.join(SUITES)}")
    suite = SUITES[name]
    if not tasks:
        return suite
    known = [t.name for t in suite.tasks]
    unknown = [t for t in tasks if t not in known]
    if unknown:
        raise UserError(f"suite {name} has no task {', '.join(unknown)}; its tasks: {', '.join(known)}")
    return replace(suite, tasks=tuple(t for t in suite.tasks if t.name in tasks))


# -- judging one run ----------------------------------------------------------------------


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
    reached_at_frames: int | None = None
    first_return: float | None = None  # the first evaluation (the rise is measured from it)
    updates: int | None = None  # summary.json: the whole run
    frames: int | None = None
    updates_per_s: float | None = None
    finished_by: str | None = None
    error: str | None = None  # why the seed has no result (not run, crashed)
    # --check: settings this run had other than its task has now (a preset tuned since it ran).
    settings_changed: list[str] = field(default_factory=list)


def judge(run_dir: Path, minutes: float, threshold: float | None, wall_minutes: float | None = None) -> SeedResult:
    """``threshold`` None: no bar; the seed passes when it evaluated at all."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise UserError(f"{run_dir}: no metrics.jsonl; pass a run directory (or remove an unfinished one)")
    evals = [r for r in map(json.loads, path.read_text().splitlines()) if eval_return(r) is not None]
    if evals and "wall_s" not in evals[0]:
        raise UserError(f"{run_dir}: its eval records have no wall_s (an older run); rerun it")
    inside = [r for r in evals if r["wall_s"] <= 60.0 * minutes]
    best = max(inside, key=eval_return, default=None)
    reached = None if threshold is None else next((r for r in inside if eval_return(r) >= threshold), None)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    if threshold is None:
        passed = bool(evals) and "finished_by" in summary
    else:
        passed = best is not None and eval_return(best) >= threshold
    return SeedResult(
        run_dir=str(run_dir),
        best_return=eval_return(best) if best else None,
        best_at_minutes=best["wall_s"] / 60.0 if best else None,
        best_at_frames=best["frames"] if best else None,
        reached_at_minutes=reached["wall_s"] / 60.0 if reached else None,
        final_return=eval_return(evals[-1]) if evals else None,
        evaluations=len(evals),
        wall_minutes=wall_minutes,
        passed=passed,
        reached_at_frames=reached["frames"] if reached else None,
        first_return=eval_return(evals[0]) if evals else None,
        updates=summary.get("updates"),
        frames=summary.get("frames"),
        updates_per_s=summary.get("updates_per_s"),
        finished_by=summary.get("finished_by"),
    )


def missing(run_dir: Path, why: str) -> SeedResult:
    return SeedResult(run_dir=str(run_dir), best_return=None, best_at_minutes=None, best_at_frames=None,
                      reached_at_minutes=None, final_return=None, evaluations=0, wall_minutes=None,
                      passed=False, error=why)


# -- running one seed ---------------------------------------------------------------------


def launch(overrides: list[str], minutes: float, run_dir: Path) -> tuple[int, float]:
    """``python -m dreamer`` in its own process, its output in RUN_DIR.log; returns
    (exit status, wall minutes). A run past its budget plus GRACE_S is killed (status -9)."""
    args = ["-m", "dreamer", *overrides, f"hydra.run.dir={run_dir}", *LAUNCH_OVERRIDES]
    print("$ " + " ".join(args), flush=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    status = run_python(args, run_dir.parent / f"{run_dir.name}.log", 60 * minutes + GRACE_S)
    return status, (time.perf_counter() - start) / 60.0


def run_python(args: list[str], log_path: Path, timeout_s: float) -> int:
    """``python ARGS`` from the repository, its output into ``log_path``; its exit status,
    -9 when it was killed past ``timeout_s``. (The test suite starts these runs its own way.)"""
    with open(log_path, "w") as log:
        try:
            return subprocess.run([sys.executable, *args], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, timeout=timeout_s,
                                  env={**os.environ, "SDL_VIDEODRIVER": "dummy"}).returncode
        except subprocess.TimeoutExpired:
            return -9


def run_overrides(experiment: str, seed: int, minutes: float, episodes: int, extra: list[str]) -> list[str]:
    return [f"experiment={experiment}", f"seed={seed}", f"train.max_minutes={minutes}",
            f"eval.episodes={episodes}", *extra]


# -- one preset (the original mode) -------------------------------------------------------


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


def check_one_preset(args, overrides: list[str]) -> int:
    experiment = args.experiment or "small"
    seeds = [0, 1, 2] if args.seeds is None else args.seeds
    minutes = 30.0 if args.minutes is None else args.minutes
    threshold = -400.0 if args.threshold is None else args.threshold
    episodes = 10 if args.episodes is None else args.episodes
    if minutes <= 0 or episodes <= 0:
        raise UserError("--minutes and --episodes must be > 0")
    if args.check:
        out = args.out or args.check[0].parent
        results = [judge(run_dir, minutes, threshold) for run_dir in args.check]
    else:
        out = args.out or REPO / "outputs" / "learning_check" / experiment
        out.mkdir(parents=True, exist_ok=True)
        results = []
        for seed in seeds:
            run_dir = out / f"seed_{seed}"
            if run_dir.exists():
                raise UserError(f"{run_dir} exists; pass another --out or remove it")
            status, wall = launch(run_overrides(experiment, seed, minutes, episodes, overrides), minutes, run_dir)
            if status != 0:
                raise SystemExit(f"error: seed {seed} exited with {status}; see {run_dir}.log")
            results.append(judge(run_dir, minutes, threshold, wall))
    report(results, threshold, minutes)

    from dreamer.report.plots import load_run, plot_runs

    curve = plot_runs([load_run(Path(r.run_dir)) for r in results], out / "learning_curve.png", x_axis="minutes")
    needed = len(results) if args.min_pass is None else args.min_pass
    passed = sum(r.passed for r in results)
    summary = {"experiment": experiment, "minutes": minutes, "threshold": threshold,
               "episodes": episodes, "overrides": overrides, "passed": passed, "needed": needed,
               "seeds": [asdict(r) for r in results]}
    (out / "learning_check.json").write_text(json.dumps(summary, indent=2))
    print(f"\n{passed}/{len(results)} passed (need {needed}); {out / 'learning_check.json'}, {curve}")
    return 0 if passed >= needed else 1


# -- a suite ------------------------------------------------------------------------------


@dataclass
class TaskResult:
    task: Task
    seeds: list[SeedResult]
    passed: int = 0
    needed: int = 0
    ok: bool = False
    # Over seeds; a seed that never reached the threshold counts as never (inf):
    # None when half or more of them never did.
    median_minutes_to_threshold: float | None = None
    median_frames_to_threshold: float | None = None
    final_return_mean: float | None = None
    final_return_std: float | None = None
    rise_mean: float | None = None  # best inside the budget minus the first evaluation
    updates_per_s: float | None = None
    frames: float | None = None
    figure: str | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        t, seeds = self.task, self.seeds
        self.passed = sum(s.passed for s in seeds)
        self.needed = len(t.seeds) - t.allowed_misses
        self.ok = self.passed >= self.needed
        if t.threshold is not None:
            self.median_minutes_to_threshold = _median_or_none([s.reached_at_minutes for s in seeds])
            self.median_frames_to_threshold = _median_or_none([s.reached_at_frames for s in seeds])
        finals = [s.final_return for s in seeds if s.final_return is not None]
        if finals:
            self.final_return_mean, self.final_return_std = statistics.fmean(finals), statistics.pstdev(finals)
        rises = [s.best_return - s.first_return for s in seeds
                 if s.best_return is not None and s.first_return is not None]
        self.rise_mean = statistics.fmean(rises) if rises else None
        rates = [s.updates_per_s for s in seeds if s.updates_per_s is not None]
        self.updates_per_s = statistics.fmean(rates) if rates else None
        frames = [s.frames for s in seeds if s.frames is not None]
        self.frames = statistics.fmean(frames) if frames else None


def _median_or_none(values: list[float | None]) -> float | None:
    if not values:
        return None
    median = statistics.median(math.inf if v is None else v for v in values)
    return None if math.isinf(median) else median


def composed_config(overrides: list[str]) -> dict:
    """The config (as its config.json holds it) that ``python -m dreamer OVERRIDES`` runs with."""
    import hydra
    from hydra.core.global_hydra import GlobalHydra

    from dreamer.config import load_config, register_configs, to_dict

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with hydra.initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            return to_dict(load_config(hydra.compose("config", overrides=overrides), environ=os.environ))
    finally:
        GlobalHydra.instance().clear()


def changed_settings(ran: dict, now: dict) -> list[str]:
    """'key: ran A, now B' for every setting a finished run's config.json has other than today's."""
    from dreamer.run.resume import flatten

    ran, now = flatten(ran), flatten(now)
    absent = "(absent)"
    return [f"{key}: ran {ran.get(key, absent)}, now {now.get(key, absent)}"
            for key in sorted(ran.keys() | now.keys()) if ran.get(key, absent) != now.get(key, absent)]


def settings_changed_since(run_dir: Path, suite: Suite, task: Task, seed: int, extra: list[str]) -> list[str]:
    """What a finished run of TASK ran with other than the task composes today."""
    now = composed_config([*run_overrides(task.experiment, seed, task.minutes, task.episodes,
                                          [*task.overrides(), *suite.overrides, *extra]), *LAUNCH_OVERRIDES])
    return changed_settings(json.loads((run_dir / "config.json").read_text()), now)


def _budget_of(run_dir: Path) -> float | None:
    """The train.max_minutes a finished run had (None: not run or not finished)."""
    config = run_dir / "config.json"
    if not (run_dir / "summary.json").is_file() or not config.is_file():
        return None
    return json.loads(config.read_text())["train"]["max_minutes"]


def run_suite(suite: Suite, out: Path, extra: list[str]) -> list[TaskResult]:
    """Every task's seeds, one process at a time; a seed already finished in OUT is judged, not rerun."""
    plan = [(task, seed, out / task.name / f"seed_{seed}") for task in suite.tasks for seed in task.seeds]
    unfinished = [str(d) for _, _, d in plan if d.exists() and not (d / "summary.json").is_file()]
    if unfinished:
        raise UserError(f"{unfinished[0]} exists but did not finish (no summary.json); remove it to run it again"
                        + (f" ({len(unfinished) - 1} more)" if len(unfinished) > 1 else ""))
    for task, seed, run_dir in plan:
        ran_for = _budget_of(run_dir)
        if ran_for is None:
            continue
        if not math.isclose(ran_for, task.minutes):
            raise UserError(f"{run_dir} ran with a {ran_for:g}-minute budget and {task.name} now has "
                            f"{task.minutes:g}: move it aside to run it again")
        # A preset tuned since (a learning rate, a network size) must not be judged as today's.
        changed = settings_changed_since(run_dir, suite, task, seed, extra)
        if changed:
            more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
            raise UserError(f"{run_dir} ran with other settings than {task.name} has now ({changed[0]}{more}): "
                            f"move it aside to run it again")
    results: dict[str, list[SeedResult]] = {t.name: [] for t in suite.tasks}
    for i, (task, seed, run_dir) in enumerate(plan, 1):
        print(f"[{i}/{len(plan)}] {task.name} seed {seed}, {task.minutes:g} min", flush=True)
        if run_dir.exists():
            print(f"finished before: judging {run_dir}", flush=True)
            results[task.name].append(judge(run_dir, task.minutes, task.threshold))
            continue
        overrides = run_overrides(task.experiment, seed, task.minutes, task.episodes,
                                  [*task.overrides(), *suite.overrides, *extra])
        status, wall = launch(overrides, task.minutes, run_dir)
        if status != 0:
            why = "killed past its budget" if status == -9 else f"exited with {status}"
            print(f"seed {seed} {why}; see {run_dir}.log", flush=True)
            result = missing(run_dir, f"{why}; see {run_dir.name}.log")
            if (run_dir / "metrics.jsonl").is_file():  # what it evaluated before failing still shows
                result = replace(judge(run_dir, task.minutes, task.threshold, wall), passed=False, error=result.error)
        else:
            result = judge(run_dir, task.minutes, task.threshold, wall)
        results[task.name].append(result)
    return [TaskResult(task, results[task.name]) for task in suite.tasks]


def check_suite_runs(suite: Suite, out: Path, extra: list[str]) -> list[TaskResult]:
    if not out.is_dir():
        raise UserError(f"{out}: not a directory; pass the suite's output directory (its --out)")
    if not any((out / t.name).is_dir() for t in suite.tasks):
        names = ", ".join(t.name for t in suite.tasks)
        raise UserError(f"{out} holds no run of suite {suite.name} (looked for {names})")
    tasks = []
    for task in suite.tasks:
        seeds = []
        for seed in task.seeds:
            run_dir = out / task.name / f"seed_{seed}"
            if not run_dir.exists():
                seeds.append(missing(run_dir, "not run"))
                continue
            result = judge(run_dir, task.minutes, task.threshold)
            if (run_dir / "config.json").is_file():
                result.settings_changed = settings_changed_since(run_dir, suite, task, seed, extra)
            if result.settings_changed:
                shown, rest = result.settings_changed[:3], len(result.settings_changed) - 3
                print(f"note: {run_dir} ran with other settings than {task.name} has now "
                      f"({'; '.join(shown)}{f'; and {rest} more' if rest > 0 else ''}): judged as it ran", flush=True)
            seeds.append(result)
        tasks.append(TaskResult(task, seeds))
    return tasks


def _num(value: float | None, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def suite_table(suite: Suite, tasks: list[TaskResult]) -> str:
    """Markdown: one row per task (LEARNING.md's suite table)."""
    rows = ["| task | preset | env | budget | threshold | seeds passing | median min to threshold "
            "| median env frames to threshold | final return | updates/s | env frames | random policy |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in tasks:
        t = r.task
        if t.threshold is None:
            bar, passing = "none (reported)", f"{r.passed}/{len(t.seeds)} ran"
            if r.rise_mean is not None:
                passing += f", rise {r.rise_mean:+.0f}"
        else:
            bar = f">= {t.threshold:g}"
            passing = f"{r.passed}/{len(t.seeds)} (need {r.needed})" + ("" if r.ok else " NO")
        final = "-" if r.final_return_mean is None else f"{r.final_return_mean:.0f} ± {r.final_return_std:.0f}"
        rows.append(
            f"| {t.name} | {t.experiment} | {' '.join(t.env)} | {t.minutes:g} min | {bar} | {passing} "
            f"| {_num(r.median_minutes_to_threshold, '.1f')} | {_num(r.median_frames_to_threshold, ',.0f')} "
            f"| {final} | {_num(r.updates_per_s, '.2f')} | {_num(r.frames, ',.0f')} | {t.random_return:g} |")
    return "\n".join(rows) + "\n"


def seed_table(tasks: list[TaskResult]) -> str:
    lines = [f"{'task / seed':<44} {'reached at min':>14} {'at frames':>10} {'best':>8} {'final':>8} "
             f"{'evals':>5} {'upd/s':>6} {'frames':>9} {'wall min':>8}  pass"]
    for r in tasks:
        for s in r.seeds:
            name = f"{r.task.name}/{Path(s.run_dir).name}"
            verdict = ("yes" if s.passed else "NO") + (f" ({s.error})" if s.error else "")
            lines.append(f"{name:<44} {_fmt(s.reached_at_minutes, '14.1f')} {_fmt(s.reached_at_frames, '10d')} "
                         f"{_fmt(s.best_return, '8.1f')} {_fmt(s.final_return, '8.1f')} {s.evaluations:>5} "
                         f"{_fmt(s.updates_per_s, '6.2f')} {_fmt(s.frames, '9d')} {_fmt(s.wall_minutes, '8.1f')}"
                         f"  {verdict}")
    return "\n".join(lines)


def plot_task(result: TaskResult, out: Path) -> Path:
    """Eval return against wall-clock minutes and against env frames: mean ± std
    over seeds, each seed faint, the random-policy level and the threshold drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dreamer.report.plots import load_run, mean_std

    t = result.task
    runs = [load_run(Path(s.run_dir)) for s in result.seeds if s.evaluations]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, axis in zip(axes, ("minutes", "frames")):
        xs = [r.eval_minutes if axis == "minutes" else r.eval_frames for r in runs]
        for x, r in zip(xs, runs):
            ax.plot(x, r.eval_returns, color="tab:blue", alpha=0.3, linewidth=0.8)
        x, mean, std = mean_std(xs, [r.eval_returns for r in runs])
        if len(x):
            ax.plot(x, mean, color="tab:blue", marker="o", markersize=3,
                    label=f"{t.experiment}: mean ± std over {len(runs)} seed{'s' if len(runs) != 1 else ''}")
            ax.fill_between(x, mean - std, mean + std, color="tab:blue", alpha=0.2)
        ax.axhline(t.random_return, color="gray", linestyle="--", label=f"random policy ({t.random_return:g})")
        if t.threshold is not None:
            ax.axhline(t.threshold, color="tab:red", linestyle=":", label=f"threshold ({t.threshold:g})")
        if axis == "minutes":
            ax.axvline(t.minutes, color="black", alpha=0.4, linewidth=0.8, label=f"budget ({t.minutes:g} min)")
        ax.set(xlabel="wall-clock minutes since the run started" if axis == "minutes" else "env frames",
               ylabel="eval return" if axis == "minutes" else None)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{t.name}: experiment={t.experiment} {' '.join(t.env)}", fontsize=10)
    fig.tight_layout()
    path = out / f"{t.name}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def machine() -> dict:
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")),
                 platform.processor())
    # One model name covers machines of different speed: the vector ISA tells some of them apart
    # (not all: each row's updates/s is the speed record).
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo if line.startswith("flags")), [])
    isa = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "other"
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    import torch
    import torchrl

    return {"cpu": model, "vector_isa": isa, "cores": len(os.sched_getaffinity(0)), "torch": torch.__version__,
            "torchrl": torchrl.__version__, "commit": commit or None, "date": time.strftime("%Y-%m-%d %H:%M")}


def check_suite(args, extra: list[str]) -> int:
    one_preset = (args.experiment, args.seeds, args.minutes, args.threshold, args.episodes, args.min_pass)
    if any(v is not None for v in one_preset):
        raise UserError("--experiment, --seeds, --minutes, --threshold, --episodes and --min-pass are for one preset; "
                        "a suite fixes its own (pick tasks with --tasks)")
    suite = suite_by_name(args.suite, args.tasks)
    if args.check:
        if len(args.check) != 1:
            raise UserError("with --suite, --check takes one directory: the suite's output (its --out)")
        out = args.out or args.check[0]
        tasks = check_suite_runs(suite, args.check[0], extra)
    else:
        out = args.out or REPO / "outputs" / "learning_suite" / suite.name
        tasks = run_suite(suite, out, extra)
    out.mkdir(parents=True, exist_ok=True)
    for result in tasks:
        result.figure = str(plot_task(result, out))
    table = suite_table(suite, tasks)
    print("\n" + seed_table(tasks) + "\n\n" + table)
    ok = all(r.ok for r in tasks)
    summary = {"suite": suite.name, "about": suite.about, "overrides": list(suite.overrides), "extra_overrides": extra,
               "checked": bool(args.check), "machine": machine(), "ok": ok,
               "tasks": [{**asdict(r), "task": asdict(r.task)} for r in tasks]}
    (out / "learning_suite.json").write_text(json.dumps(summary, indent=2))
    (out / "learning_suite.md").write_text(table)
    failed = [r.task.name for r in tasks if not r.ok]
    print(f"{len(tasks) - len(failed)}/{len(tasks)} tasks passed"
          + (f" (failed: {', '.join(failed)})" if failed else "")
          + f"; {out / 'learning_suite.json'}, {out / 'learning_suite.md'}, {len(tasks)} figure(s) in {out}")
    return 0 if ok else 1


def random_levels(args) -> int:
    """Each task's mean return under uniformly random actions, through the env its runs build."""
    import hydra
    import torch
    from hydra.core.global_hydra import GlobalHydra

    from dreamer.config import load_config, register_configs
    from dreamer.config.location import conf_dir
    from dreamer.envs.factory import close_env, make_env

    suite = suite_by_name(args.suite, args.tasks)
    register_configs()
    GlobalHydra.instance().clear()
    print(f"{'task':<34} {'random return':>22}  episodes  (the suite records)")
    with hydra.initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        for task in suite.tasks:
            cfg = load_config(hydra.compose("config", overrides=[f"experiment={task.experiment}", *task.env]))
            torch.manual_seed(0)
            env = make_env(cfg.env, cfg.algo, seed=0)
            try:
                # No policy: the rollout draws each action from the action spec, uniformly.
                episodes = [env.rollout(cfg.env.max_episode_steps, break_when_any_done=True)
                            for _ in range(args.random_levels)]
                returns = torch.tensor([float(e["next", "episode_reward"][-1]) for e in episodes])
            finally:
                close_env(env)
            print(f"{task.name:<34} {returns.mean():>12.1f} ± {returns.std(unbiased=False):>7.1f}  "
                  f"{len(returns):>8}  ({task.random_return:g})", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    overrides: list[str] = []
    if "--" in argv:
        overrides = argv[argv.index("--") + 1:]
        argv = argv[: argv.index("--")]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    one = parser.add_argument_group("one preset")
    one.add_argument("--experiment", help="preset to train (default small)")
    one.add_argument("--seeds", type=int, nargs="+", help="default 0 1 2")
    one.add_argument("--minutes", type=float, help="wall-clock budget per seed (default 30)")
    one.add_argument("--threshold", type=float, help="eval return to reach (default -400)")
    one.add_argument("--episodes", type=int, help="episodes per evaluation (default 10)")
    one.add_argument("--min-pass", type=int, help="seeds that must pass (default: all)")
    many = parser.add_argument_group("a suite")
    many.add_argument("--suite", help=f"run this suite of tasks instead: {', '.join(SUITES)}")
    many.add_argument("--tasks", nargs="+", metavar="TASK", help="only these tasks of the suite")
    many.add_argument("--random-levels", type=int, metavar="EPISODES",
                      help="measure each task's random-policy return over this many episodes; no training")
    parser.add_argument("--out", type=Path, help="output directory (default outputs/learning_check/<experiment>, "
                                                 "outputs/learning_suite/<suite>)")
    parser.add_argument("--check", type=Path, nargs="+", metavar="RUN_DIR",
                        help="judge finished runs instead of training (with --suite: the suite's output directory)")
    args = parser.parse_args(argv)
    try:
        if args.suite is None:
            if args.tasks or args.random_levels:
                raise UserError("--tasks and --random-levels need --suite NAME")
            return check_one_preset(args, overrides)
        if args.random_levels is not None:
            if args.random_levels <= 0:
                raise UserError("--random-levels must be > 0 episodes")
            return random_levels(args)
        return check_suite(args, overrides)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

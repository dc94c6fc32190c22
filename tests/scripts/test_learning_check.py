"""scripts/learning_check.py and train.max_minutes: a preset trained for a
wall-clock budget finishes by time with a final evaluation, and the check
passes or fails on the eval return inside that budget; a suite (--suite ci:
the cpu suite's tasks at toy sizes) runs every task, judges, tables and plots
them, and re-judges finished runs with --check."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support import paced_env
from tests.support.paths import REPO_ROOT, SCRIPTS
from tests.support.processes import run_dreamer_into_log
from tests.support.scripts import load_script

ROOT = REPO_ROOT
SCRIPT = ROOT / "scripts" / "learning_check.py"
BUDGET_MIN = 0.5  # start-up (longer beside a cold compile elsewhere on the box) and evaluated updates


def check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL)


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_a_run_stops_at_its_time_budget_and_the_check_judges_its_evals(tmp_path):
    out = tmp_path / "check"
    result = check(
        "--experiment", "smoke", "--seeds", "0", "--minutes", str(BUDGET_MIN), "--threshold=-1e9",
        "--episodes", "1", "--out", str(out),
        "--", "compile=off", "eval.video=false", "collector.num_workers=0", "threads=1", "eval.every=5",
        "train.total_frames=100000000",  # only the clock can end this run
        # Paced: the run waits for its clock mostly asleep, not training flat out beside other tests.
        *paced_env.OVERRIDES, "train.train_ratio=4",
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    run_dir = out / "seed_0"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["finished_by"] == "max_minutes"
    assert summary["frames"] < 100_000_000 and summary["eval_episodes"] == 1  # final eval ran
    assert summary["wall_s"] >= 60 * BUDGET_MIN  # the budget was spent; finished_by says the clock ended it
    evals = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in evals if "eval_sample_return_mean" in r]
    assert evals and all("wall_s" in r for r in evals)
    report = json.loads((out / "learning_check.json").read_text())
    seed = report["seeds"][0]
    assert report["passed"] == 1 and seed["best_at_minutes"] <= BUDGET_MIN
    # Any return clears -1e9, so the first evaluation inside the budget is where it was reached.
    first_eval_minutes = min(r["wall_s"] for r in evals) / 60.0
    assert seed["reached_at_minutes"] == first_eval_minutes <= seed["best_at_minutes"]
    assert (out / "learning_curve.png").stat().st_size > 0

    # The same run against a return Pendulum cannot reach (its rewards are <= 0).
    again = check("--check", str(run_dir), "--minutes", str(BUDGET_MIN), "--threshold", "0",
                  "--out", str(tmp_path / "again"))
    assert again.returncode == 1, again.stdout + again.stderr
    assert "0/1 passed" in again.stdout and "NO" in again.stdout


# -- the suite ---------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_the_ci_suite_runs_every_cpu_task_and_check_judges_them_against_the_cpu_bars(tmp_path, capsys, monkeypatch):
    """Every task of the cpu suite (each preset on each env, V3 on discrete CartPole
    included) builds, collects, updates and evaluates at toy sizes; the same runs
    judged against the cpu suite's bars fail, and bad input is one line, exit 2.
    The script runs here; its runs start from the test's fork server (the budget test
    above starts them as the script does)."""
    script = load_script(SCRIPTS / "learning_check.py")
    monkeypatch.setattr(script, "run_python", run_dreamer_into_log)
    cpu = {t.name: t for t in script.CPU.tasks}
    out = tmp_path / "ci"
    assert script.main(["--suite", "ci", "--out", str(out)]) == 0, capsys.readouterr()
    report = json.loads((out / "learning_suite.json").read_text())
    assert report["ok"] and report["machine"]["cpu"]
    assert report["machine"]["vector_isa"] in ("avx512", "avx2", "other")
    assert [t["task"]["name"] for t in report["tasks"]] == list(cpu)
    table = (out / "learning_suite.md").read_text()
    for task in report["tasks"]:
        name, (seed,) = task["task"]["name"], task["seeds"]
        assert task["task"]["experiment"] == cpu[name].experiment and task["task"]["env"] == list(cpu[name].env)
        # Ended by its tiny frame budget after learning, not by a crash or the clock.
        assert seed["finished_by"] == "total_frames" and seed["updates"] > 0 and seed["evaluations"] >= 2, name
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"| {name} | {cpu[name].experiment} |" in table

    # The same runs against the real bars: CartPole at 16-step episodes cannot
    # reach 400, and seeds the cpu suite wants but ci never ran count as misses.
    capsys.readouterr()
    assert script.main(["--suite", "cpu", "--check", str(out), "--out", str(tmp_path / "as_cpu")]) == 1
    as_cpu = json.loads((tmp_path / "as_cpu" / "learning_suite.json").read_text())
    judged = {t["task"]["name"]: t for t in as_cpu["tasks"]}
    assert not judged["cartpole_v3"]["ok"] and judged["cartpole_v3"]["seeds"][0]["passed"] is False
    assert [s["error"] for s in judged["pendulum_v3"]["seeds"]] == [None, "not run", "not run"]
    assert judged["dmc_cartpole_swingup_pixels_v3"]["ok"]  # no bar: reported, never failed
    # Judged as they ran, with what they ran differently from the cpu task today on record.
    changed = judged["pendulum_v3"]["seeds"][0]["settings_changed"]
    assert "algo.hidden_dim: ran 16, now 64" in changed
    assert f"train.max_minutes: ran {script.CI_MINUTES}, now 30.0" in changed
    checked = capsys.readouterr().out
    assert "NO (not run)" in checked and "pendulum_v3/seed_0 ran with other settings" in checked

    # Running the suite again continues it: finished seeds are judged, none retrained.
    assert script.main(["--suite", "ci", "--out", str(out)]) == 0
    again = capsys.readouterr().out
    assert again.count("finished before") == len(cpu) and "-m dreamer" not in again

    # A finished run made under another budget is not judged as if it had this one.
    config_path = out / "pendulum_v3" / "seed_0" / "config.json"
    config = json.loads(config_path.read_text())
    config["train"]["max_minutes"] = 30.0
    config_path.write_text(json.dumps(config))
    assert script.main(["--suite", "ci", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"ran with a 30-minute budget and pendulum_v3 now has {script.CI_MINUTES:g}" in err and err.count("\n") == 1
    # Nor one made before its preset was tuned: the changed setting is named.
    config["train"]["max_minutes"] = script.CI_MINUTES
    ran_lr = config["algo"]["actor_lr"]
    config["algo"]["actor_lr"] = ran_lr / 2
    config_path.write_text(json.dumps(config))
    assert script.main(["--suite", "ci", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert f"ran with other settings than pendulum_v3 has now (algo.actor_lr: ran {ran_lr / 2}, now {ran_lr})" in err
    assert err.count("\n") == 1 and "-m dreamer" not in captured.out  # refused before training anything

    assert script.main(["--suite", "nope"]) == 2
    assert capsys.readouterr().err == "error: unknown suite 'nope'; choose one of: cpu, ci\n"
    (tmp_path / "bad" / "pendulum_v3" / "seed_0").mkdir(parents=True)  # a run that never wrote metrics
    assert script.main(["--suite", "ci", "--check", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert "no metrics.jsonl" in err and err.count("\n") == 1


def test_random_levels_are_measured_through_the_tasks_own_env(capsys):
    script = load_script(SCRIPTS / "learning_check.py")
    assert script.main(["--suite", "cpu", "--tasks", "cartpole_v3", "--random-levels", "3"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("cartpole_v3"))
    mean = float(row.split()[1])
    assert 8 <= mean <= 200  # random CartPole episodes last tens of steps (+1 per step)


def test_the_cpu_suite_changes_only_the_env_between_the_tasks_of_one_preset():
    """Presets fixed across tasks (issues 18 and 55): composed as the runs compose them, two
    tasks of one preset differ in env.* alone."""
    import hydra
    from hydra.core.global_hydra import GlobalHydra

    from dreamer.config import load_config, register_configs, to_dict

    script = load_script(SCRIPTS / "learning_check.py")
    register_configs()
    GlobalHydra.instance().clear()
    by_preset: dict[str, list[dict]] = {}
    with hydra.initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for task in script.CPU.tasks:
            composed = hydra.compose("config", overrides=[f"experiment={task.experiment}", *task.overrides(),
                                                          *script.CPU.overrides])
            by_preset.setdefault(task.experiment, []).append(to_dict(load_config(composed)))
    GlobalHydra.instance().clear()
    # A task is judged by its evaluations inside the budget: a published preset's cadence (20,000
    # updates) would leave a CPU run of an hour only its last one.
    assert all(cfg["eval"]["every"] <= 1000 for configs in by_preset.values() for cfg in configs)
    assert {name: cfg["algo"]["name"] for name, (cfg, *_) in by_preset.items()} == {
        "small": "dreamer_v3", "small_v1": "dreamer_v1", "gym_state_v3": "dreamer_v3"}
    assert len(by_preset["small"]) == 7
    for configs in by_preset.values():
        without_env = [{k: v for k, v in cfg.items() if k != "env"} for cfg in configs]
        assert all(c == without_env[0] for c in without_env)
    envs = [(c["env"]["backend"], c["env"]["name"], c["env"]["from_pixels"]) for c in by_preset["small"]]
    assert len(set(envs)) == len(envs)  # seven different tasks

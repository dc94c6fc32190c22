"""End to end, as a user at the terminal: `python -m dreamer ...`."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import imageio
import pytest

from tests.support import wandb_records
from tests.support.processes import FAST_TRAIN_RATIO, read_metrics, run_dreamer

SUMMARY_KEYS = {
    "frames", "updates", "wall_s", "updates_per_s", "frames_per_s", "eval_policy", "eval_return_mean",
    "eval_return_std", "eval_episodes", "compile_warmup_s",
}


# Eager: a cold compile of the smoke's losses costs minutes of CPU; compiled runs end to end,
# their console and their portable compile cache are tests/run/test_background_compile.py's.
# One update per four agent steps: every stage still runs (evaluation, videos, checkpoints).
# The resumes below repeat the command, as a user would.
SMOKE = ("experiment=smoke", "compile=off", f"train.train_ratio={FAST_TRAIN_RATIO}")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("smoke")
    # A fresh interpreter: the console test below covers what prints while the libraries import.
    result = run_dreamer(*SMOKE, f"hydra.run.dir={run_dir}", "logger.progress_bar=false", fresh=True)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir / "console.txt").write_text(result.stdout + result.stderr)
    return run_dir


def test_a_normal_run_prints_our_lines_only(smoke_run: Path):
    """Library warnings (tensordict's and torch's deprecations, dynamo's hints, dm_control's
    absl lines) and torchrl's INFO lines are filtered, in the learner and in the workers."""
    printed = [line for line in (smoke_run / "console.txt").read_text().splitlines() if line.strip()]
    assert printed and all("][dreamer][" in line for line in printed), [
        line for line in printed if "][dreamer][" not in line][:5]


def test_help_shows_the_config_groups():
    result = run_dreamer("--help")
    assert result.returncode == 0
    for group in ("env:", "algo:", "collector:", "buffer:", "compile:", "logger:", "experiment:"):
        assert group in result.stdout


def test_cfg_job_prints_the_resolved_config():
    result = run_dreamer("--cfg", "job", "experiment=smoke")
    assert result.returncode == 0, result.stderr
    assert "train_ratio" in result.stdout and "experiment: smoke" in result.stdout


def test_smoke_run_leaves_summary_metrics_checkpoint_and_videos(smoke_run: Path):
    summary = json.loads((smoke_run / "summary.json").read_text())
    assert SUMMARY_KEYS <= summary.keys()
    assert summary["frames"] >= 600 and summary["updates"] > 0
    assert summary["eval_episodes"] == 1
    metrics = read_metrics(smoke_run)
    assert all({"frames", "updates"} <= m.keys() for m in metrics)
    assert any("loss_model_reco" in m for m in metrics)
    assert any("eval_sample_return_mean" in m for m in metrics)  # eval.policy=sample, named so
    # The training curve: 300 agent steps hold six 50-step episodes, the last may end after the last record.
    assert 5 <= sum(m.get("train_episodes", 0) for m in metrics) <= 6
    assert all(m["train_episode_length"] == 50 for m in metrics if "train_episodes" in m)
    assert list((smoke_run / "checkpoints").glob("ckpt_*.pt"))
    assert list((smoke_run / "videos").glob("eval_video_*.mp4"))
    # open-loop imagination: batch_length steps, rows true / predicted / error, batch_size columns
    openloop = sorted((smoke_run / "videos").glob("openloop_*.mp4"))
    assert openloop
    frames = imageio.mimread(openloop[-1])
    assert len(frames) == 10 and frames[0].shape == (3 * 64, 4 * 64, 3)


def test_resume_continues_counters_from_the_checkpoint(smoke_run: Path):
    before = json.loads((smoke_run / "summary.json").read_text())
    n_lines = len(read_metrics(smoke_run))
    # On another machine shape (collected in the learner's process): workers and threads may change.
    result = run_dreamer(*SMOKE, f"resume={smoke_run}", "train.total_frames=700",
                         "collector.num_workers=0", "threads=1", "logger.progress_bar=false")
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stdout + result.stderr
    assert f"resumed from {smoke_run} at frames={before['frames']} updates={before['updates']}" in log
    # the learner process keeps freed host memory (glibc's malloc; elsewhere a no-op)
    assert f"retain_host_memory={platform.libc_ver()[0] == 'glibc'}" in log
    after = json.loads((smoke_run / "summary.json").read_text())
    assert after["frames"] >= 700 and after["updates"] > before["updates"]
    new = read_metrics(smoke_run)[n_lines:]
    assert new and min(m["updates"] for m in new) > before["updates"]
    assert min(m["frames"] for m in new) >= before["frames"]


def test_resume_refuses_an_override_outside_the_allow_list(smoke_run: Path, tmp_path):
    checkpoints = sorted((smoke_run / "checkpoints").iterdir())
    result = run_dreamer(*SMOKE, f"resume={smoke_run}", "buffer.batch_size=8",
                     f"hydra.run.dir={tmp_path}")
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: resume=") and "Traceback" not in result.stderr
    assert "refused override: buffer.batch_size (saved 4, given 8)" in lines[-1]
    assert sorted((smoke_run / "checkpoints").iterdir()) == checkpoints  # nothing touched


def test_wandb_run_offline_without_an_account_carries_config_tags_curve_and_video_and_resumes_into_it(tmp_path):
    run_dir = tmp_path / "run"
    env_without_key = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    # Collected in the learner's process on one thread (no worker to spawn): this test is about W&B.
    overrides = ["experiment=smoke", "logger=wandb", "compile=off", "logger.progress_bar=false",
                 "collector.num_workers=0", "threads=1", f"train.train_ratio={FAST_TRAIN_RATIO}",
                 "logger.group=ci-group", "logger.tags=[ci-tag]", "algo.imagination_horizon=4"]

    def dreamer_offline(*more: str) -> None:
        result = run_dreamer(*overrides, *more, env={**env_without_key, "SDL_VIDEODRIVER": "dummy",
                                                      "HOME": str(tmp_path)})
        assert result.returncode == 0, result.stderr[-3000:]

    dreamer_offline("train.total_frames=300", f"hydra.run.dir={run_dir}")
    (offline,) = wandb_records.offline_runs(run_dir)
    assert (run_dir / "summary.json").exists()
    assert list((offline / "files" / "media" / "videos").glob("eval_video_*.mp4"))
    assert list((offline / "files" / "media" / "videos").glob("openloop_*.mp4"))
    assert list((offline / "files" / "media" / "images").glob("learning_curve_*.png"))
    assert (run_dir / "learning_curve.png").exists()
    (records,) = offline.glob("*.wandb")
    data = records.read_bytes()
    for text in (b"ci-group", b"ci-tag", b"imagination_horizon", b"eval_sample_return_mean", b"loss_model_kl"):
        assert text in data, text
    # One history row per metrics.jsonl record (plus one per video / image), x axis env frames.
    metrics = read_metrics(run_dir)
    rows = wandb_records.history(offline)
    assert [row["step"] for row in rows if "updates" in row] == [m["frames"] for m in metrics]
    assert len(rows) == len(metrics) + sum(1 for row in rows if "updates" not in row)
    media = {k.split("/")[0] for row in rows if "updates" not in row for k in row if not k.startswith(("_", "step"))}
    assert media == {"eval_video", "openloop", "learning_curve", "resume_segment"}
    first_segment = {row["resume_segment"] for row in rows}
    assert len(first_segment) == 1  # every row says which start of the run directory logged it

    # The resumed run logs into the same W&B run.
    dreamer_offline(f"resume={run_dir}", "train.total_frames=400", f"hydra.run.dir={tmp_path / 'h'}")
    first, resumed = wandb_records.offline_runs(run_dir)
    run_id = json.loads((run_dir / "wandb_run.json").read_text())["run_id"]
    assert wandb_records.run_ids(first) == wandb_records.run_ids(resumed) == {run_id}
    resumed_rows = wandb_records.history(resumed)
    assert min(row["step"] for row in resumed_rows) >= metrics[-1]["frames"]
    assert {row["resume_segment"] for row in resumed_rows} == {first_segment.pop() + 1}


# One process per error layer, each ending in one `error:` line (exit 2); every other
# case runs the same code path in-process (tests/config/test_errors.py). The value checks'
# layer has its process in tests/e2e/test_bad_inputs_up_front.py.
# (overrides, message)
BAD_INPUTS = {
    # preflight: Hydra's composition error, caught before Hydra runs
    "unknown preset": (["experiment=nope"],
                       "Could not find 'experiment/nope'; choose experiment= one of: "
                       "atari100k_v3, atari_pong_v1, dmc_cheetah_run_v1,"),
    # build time: the env factory
    "unknown env": (["env.name=NoSuchEnv-v9"], "unknown gymnasium env 'NoSuchEnv-v9'; available:"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_clear_line(case, tmp_path):
    overrides, message = BAD_INPUTS[case]
    overrides = [*overrides, f"hydra.run.dir={tmp_path / 'run'}"]
    result = run_dreamer(*overrides, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error: ") and message in lines[-1], lines[-1:]
    assert "Traceback" not in result.stderr


V3_TINY = (
    "algo=dreamer_v3", "compile=off", "env.max_episode_steps=50",
    "algo.rssm_hidden_dim=16", "algo.hidden_dim=16", "algo.num_categoricals=4", "algo.num_classes=4",
    "algo.num_bins=31", "algo.mlp_layers=1", "algo.imagination_horizon=3",
    "collector.num_workers=0", "threads=1", "collector.frames_per_batch=25", "collector.init_random_frames=50",
    "buffer.batch_size=2", "buffer.batch_length=10", "buffer.capacity=1000",
    "train.train_ratio=10", "logger.log_every=5", "eval.every=10", "eval.episodes=1",
    "checkpoint.every=10", "logger.progress_bar=false",
)


def test_dreamer_v3_tiny_run_trains_evaluates_and_resumes(tmp_path):
    run_dir = tmp_path / "v3"
    result = run_dreamer(*V3_TINY, "train.total_frames=300", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert SUMMARY_KEYS <= summary.keys()
    assert summary["frames"] >= 300 and summary["updates"] > 0
    metrics = read_metrics(run_dir)
    assert any("loss_model_dynamic" in m and "return_scale" in m for m in metrics)
    assert any("eval_sample_return_mean" in m for m in metrics)  # eval.policy=sample, named so
    assert list((run_dir / "checkpoints").glob("ckpt_*.pt"))
    assert not list(run_dir.glob("videos/openloop_*"))  # state observations: no images to imagine

    resumed = run_dreamer(*V3_TINY, f"resume={run_dir}", "train.total_frames=400")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = json.loads((run_dir / "summary.json").read_text())
    assert after["frames"] >= 400 and after["updates"] > summary["updates"]


def test_dreamer_v3s_proprio_setting_trains_on_cartpoles_short_episodes(tmp_path):
    """Issue 55: `experiment=gym_state_v3 env.name=CartPole-v1` (64-step sequences) on random
    CartPole, whose episodes last ~22 steps: it was refused at the first sample ('no episode in
    the replay is as long as buffer.batch_length=64') for most seeds. Sequences now run across
    episode ends; the run learns from them (tiny networks: what is under test is the replay)."""
    run_dir = tmp_path / "run"
    proc = run_dreamer(
        "experiment=gym_state_v3", "env.name=CartPole-v1", "seed=1", "compile=off",
        "algo.hidden_dim=16", "algo.rssm_hidden_dim=16", "algo.num_categoricals=4", "algo.num_classes=4",
        "algo.num_bins=31", "algo.mlp_layers=1", "algo.imagination_horizon=3", "collector.num_workers=0",
        "threads=1", "collector.init_random_frames=1024", "train.total_frames=1100", "train.train_ratio=512",
        "eval.every=1000", "eval.episodes=1", "logger.progress_bar=false", f"hydra.run.dir={run_dir}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["updates"] > 0 and summary["eval_episodes"] == 1

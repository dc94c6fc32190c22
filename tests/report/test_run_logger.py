"""dreamer/report/logger.py: one W&B run per run directory, one history row per
record, records rewound to the checkpoint on resume (metrics.jsonl and CSV)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from dreamer.config import LoggerConfig
from dreamer.report.logger import RunLogger
from tests.support.wandb_records import history, offline_runs, run_ids


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """W&B offline without an account: no key, no settings from the real home."""
    for key in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WANDB_MODE", "offline")  # torchrl sets it to dryrun; restored after the test
    monkeypatch.setenv("WANDB_SILENT", "true")
    yield
    import wandb

    if wandb.run is not None:  # a test that failed before closing its logger
        wandb.finish()


def _logger(run_dir, backend="wandb", **kwargs) -> RunLogger:
    cfg = LoggerConfig(backend=backend, mode="offline")
    return RunLogger(cfg, run_dir, run_name="test", config={"seed": 1}, **kwargs)


def _checkpointed(state: dict, tmp_path) -> dict:
    """Through a checkpoint file as the trainer loads it (weights_only=True)."""
    path = tmp_path / "state.pt"
    torch.save({"logger": state}, path)
    return torch.load(path, weights_only=True)["logger"]


def _record(frames: int, updates: int) -> dict:
    return {"frames": frames, "updates": updates, "loss_model": 1.5, "loss_actor": -0.25,
            "updates_per_s": 3.0, "eval_sample_return_mean": 7.0, "wall_s": 1.0}


def test_every_attempt_of_a_run_directory_logs_under_one_wandb_run_id(offline_wandb, tmp_path):
    run_dir = tmp_path / "run"
    first = _logger(run_dir)
    first.log(_record(100, 1))
    saved = _checkpointed(first.state_dict(), tmp_path)
    first.close()
    # An attempt killed before its first checkpoint starts afresh in the same directory.
    second = _logger(run_dir)
    second.close()
    # A resume from the checkpoint.
    resumed = _logger(run_dir, saved_state=saved)
    resumed.load_state_dict(saved)
    resumed.log(_record(200, 2))
    resumed.close()
    folders = offline_runs(run_dir)
    assert len(folders) == 3
    run_id = saved["local"]["id"]
    assert [run_ids(folder) for folder in folders] == [{run_id}] * 3
    assert all(f"-{run_id}" in folder.name for folder in folders)  # offline-run-<time>-<id>[-<n>]
    assert json.loads((run_dir / "wandb_run.json").read_text()) == {"run_id": saved["local"]["id"], "attempts": 3}


def test_each_record_is_one_wandb_history_row_at_step_env_frames(offline_wandb, tmp_path):
    logger = _logger(tmp_path)
    for i in range(1, 4):
        logger.log(_record(100 * i, i))
    logger.log_video(torch.zeros(4, 8, 8, 3, dtype=torch.uint8), "eval_video", 300)
    logger.close()
    (folder,) = offline_runs(tmp_path)
    rows = history(folder)
    assert len(rows) == 4  # three records, one video
    assert [row["step"] for row in rows] == [100, 200, 300, 300]
    assert all({"updates", "loss_model", "loss_actor", "updates_per_s"} <= row.keys() for row in rows[:3])
    assert rows[3]["eval_video/_type"] == "video-file"
    assert [row["_step"] for row in rows] == [0, 1, 2, 3]  # never moved by a step= of its own


def test_rewind_cuts_metrics_and_csv_back_to_the_checkpoint_and_drops_a_torn_line(tmp_path):
    logger = _logger(tmp_path, backend="csv")
    for i in range(1, 5):
        logger.log(_record(100 * i, i))
    scalars = tmp_path / "csv" / "scalars"
    assert (scalars / "loss_model.csv").read_text().splitlines() == [f"{f},1.5" for f in (100, 200, 300, 400)]
    with open(scalars / "loss_actor.csv", "a") as f:
        f.write("500,-0.2")  # killed mid-row
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"frames": 500, "upd')
    logger.rewind(updates=2)
    for name in ("loss_model", "loss_actor", "updates", "eval_sample_return_mean"):
        steps = [line.split(",")[0] for line in (scalars / f"{name}.csv").read_text().splitlines()]
        assert steps == ["100", "200"], name
    assert [json.loads(line)["frames"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [100, 200]
    assert not list(tmp_path.rglob("*.tmp"))
    # The resumed run appends after the kept rows.
    logger.log(_record(250, 3))
    assert (scalars / "loss_actor.csv").read_text().splitlines() == ["100,-0.25", "200,-0.25", "250,-0.25"]


def test_a_run_stopped_before_its_first_record_finishes_without_a_curve_and_one_after_draws_it(tmp_path):
    """A run stopped (a signal, max_minutes) before logger.log_every draws no curve, and does not fail."""
    logger = _logger(tmp_path, backend="csv")
    assert logger.log_learning_curve(frames_seen=1800) is None
    assert not (tmp_path / "learning_curve.png").exists()
    logger.log(_record(100, 1))
    assert logger.log_learning_curve(frames_seen=100) == tmp_path / "learning_curve.png"
    assert (tmp_path / "learning_curve.png").stat().st_size > 0


def test_a_rank_other_than_0_and_logger_none_write_nothing_and_save_no_state(tmp_path):
    idle = _logger(tmp_path / "rank1", enabled=False)
    idle.log(_record(100, 1))
    idle.rewind(0)
    assert idle.state_dict() == {} and not (tmp_path / "rank1").exists()
    none = _logger(tmp_path / "none", backend="none")
    none.log(_record(100, 1))
    none.rewind(1)
    assert none.state_dict() == {}
    assert sorted(p.name for p in (tmp_path / "none").iterdir()) == ["metrics.jsonl"]


def test_online_a_resume_from_a_checkpoint_must_reopen_its_run(tmp_path, monkeypatch):
    """No network here: the kwargs wandb.init would get, for each way a run directory starts."""
    import torchrl.record.loggers.wandb as torchrl_wandb

    opened = []

    class Spy:
        def __init__(self, *args, **kwargs):
            opened.append(kwargs)

    monkeypatch.setattr(torchrl_wandb, "WandbLogger", Spy)
    online = LoggerConfig(backend="wandb", mode="online")

    def start(saved=None):
        RunLogger(online, tmp_path, run_name="test", config={}, saved_state=saved)
        return opened[-1]["id"], opened[-1]["resume"]

    run_id, resume = start()  # a fresh run directory
    assert resume is None and len(run_id) == 8
    assert start() == (run_id, "allow")  # restarted before its first checkpoint
    saved = {"backend": "wandb", "mode": "online", "local": {"id": run_id, "step_registry": {"step": 5}}}
    (tmp_path / "wandb_run.json").unlink()
    assert start(saved) == (run_id, "must")  # resumed from a checkpoint
    assert start({**saved, "mode": "offline"}) == (run_id, "allow")  # started offline: maybe never synced


def test_a_video_is_an_mp4_whatever_other_imageio_writers_are_installed(tmp_path):
    """By extension imageio may pick another installed writer for .mp4 (tifffile, where present:
    the run then died on its arguments); the ffmpeg plugin is asked for by name."""
    logger = _logger(tmp_path, backend="csv")
    path = logger.log_video(torch.randint(0, 255, (6, 16, 16, 3), dtype=torch.uint8), "eval_video", 300)
    logger.close()
    assert path.name == "eval_video_0000000300.mp4"
    assert path.read_bytes()[4:8] == b"ftyp"  # an ISO media (MP4) container, not a TIFF

"""Records after a crash: metrics.jsonl and the CSVs cut by one key (updates) so they agree,
the cut said in one line, and W&B rows past the checkpoint rewound or marked."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch

from dreamer.config import LoggerConfig
from dreamer.report.eval_metrics import eval_return
from dreamer.report.logger import SEGMENT_KEY, RunLogger
from dreamer.report.rewind import scalars
from dreamer.run import checkpoint as ckpt
from tests.support.processes import FAST_STATES, read_metrics, start
from tests.support.wandb_records import history, offline_runs


def _logger(run_dir, backend="csv", mode="offline", **kwargs) -> RunLogger:
    return RunLogger(LoggerConfig(backend=backend, mode=mode), run_dir, run_name="test", config={}, **kwargs)


def _train(frames: int, updates: int) -> dict:
    return {"frames": frames, "updates": updates, "loss_model": updates / 10, "updates_per_s": 3.0}


def _eval(frames: int, updates: int) -> dict:
    return {"frames": frames, "updates": updates, "eval_sample_return_mean": -float(updates), "eval_episodes": 1}


def _csv(run_dir, key) -> list[tuple[float, float]]:
    path = run_dir / "csv" / "scalars" / f"{key}.csv"
    return [tuple(float(x) for x in line.split(",")) for line in path.read_text().splitlines()]


def assert_records_agree(run_dir) -> None:
    """Every CSV holds exactly the values metrics.jsonl holds for its key, step = frames;
    records in order, none repeated."""
    records = read_metrics(run_dir)
    order = [(r["updates"], eval_return(r) is not None) for r in records]  # a train record, then an eval one
    assert order == sorted(order) and len(set(order)) == len(order), order
    frames = [r["frames"] for r in records]
    assert frames == sorted(frames), frames
    keys = {p.stem for p in (run_dir / "csv" / "scalars").glob("*.csv")}
    assert keys
    for key in keys:
        expected = [(float(r["frames"]), float(scalars(r)[key])) for r in records if key in scalars(r)]
        assert _csv(run_dir, key) == expected, key


def test_records_on_both_sides_of_a_mid_batch_checkpoint_are_cut_alike(tmp_path, caplog):
    """One collector batch (frames=200) is followed by many updates: the checkpoint at
    update 20 shares its frame count with the records at updates 30 and 40 logged after
    it. Cut by frames, the CSVs kept those (and the resumed run logged 30 and 40 again)."""
    logger = _logger(tmp_path)
    for record in (_train(100, 10), _train(200, 20), _eval(200, 20), _train(200, 30), _train(200, 40),
                   _eval(200, 40), _train(300, 50)):
        logger.log(record)
    caplog.set_level(logging.INFO, "dreamer")
    logger.rewind(updates=20)
    assert [(r["frames"], r["updates"]) for r in read_metrics(tmp_path)] == [(100, 10), (200, 20), (200, 20)]
    assert_records_agree(tmp_path)
    assert _csv(tmp_path, "loss_model") == [(100.0, 1.0), (200.0, 2.0)]
    assert _csv(tmp_path, "eval_sample_return_mean") == [(200.0, -20.0)]
    lines = [r.getMessage() for r in caplog.records if "rewound" in r.getMessage()]
    assert len(lines) == 1
    assert "updates=20" in lines[0] and "4 rows from metrics.jsonl" in lines[0]
    assert "3 rows from each of csv/scalars/loss_model.csv, csv/scalars/updates_per_s.csv" in lines[0]
    # The resumed run appends after the kept rows and the records still agree.
    logger.log(_train(225, 30))
    assert_records_agree(tmp_path)


def test_a_torn_line_and_a_torn_row_are_dropped_and_counted(tmp_path, caplog):
    logger = _logger(tmp_path)
    for i in (1, 2, 3):
        logger.log(_train(100 * i, 10 * i))
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"frames": 400, "upd')  # killed mid-line
    with open(tmp_path / "csv" / "scalars" / "loss_model.csv", "a") as f:
        f.write("400,4.")  # killed mid-row
    caplog.set_level(logging.INFO, "dreamer")
    logger.rewind(updates=30)
    assert len(read_metrics(tmp_path)) == 3
    assert_records_agree(tmp_path)
    (line,) = [r.getMessage() for r in caplog.records if "rewound" in r.getMessage()]
    assert "1 row from" in line and "metrics.jsonl" in line and "csv/scalars/loss_model.csv" in line


def test_nothing_past_the_checkpoint_is_no_line(tmp_path, caplog):
    logger = _logger(tmp_path)
    logger.log(_train(100, 10))
    caplog.set_level(logging.INFO, "dreamer")
    logger.rewind(updates=10)
    assert "rewound" not in caplog.text


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    for key in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    yield
    import wandb

    if wandb.run is not None:
        wandb.finish()


def _through_checkpoint(state: dict, tmp_path) -> dict:
    path = tmp_path / "state.pt"
    torch.save({"logger": state}, path)
    return torch.load(path, weights_only=True)["logger"]


def test_offline_wandb_rows_past_the_checkpoint_are_marked_and_said(offline_wandb, tmp_path, caplog):
    """Offline, W&B cannot be rewound: the resume says so in one line, and every row carries
    the attempt that logged it, so the rows past the checkpoint can be told apart."""
    run_dir = tmp_path / "run"
    first = _logger(run_dir, backend="wandb")
    first.log(_train(100, 10))
    saved = _through_checkpoint(first.state_dict(), tmp_path)  # the checkpoint at update 10
    assert saved["history_step"] == 1
    first.log(_train(200, 20))  # past the checkpoint, then killed
    first.close()
    caplog.set_level(logging.INFO, "dreamer")
    resumed = _logger(run_dir, backend="wandb", saved_state=saved)
    resumed.load_state_dict(saved)
    resumed.rewind(updates=10)
    resumed.log(_train(200, 20))
    resumed.close()
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "W&B keeps the 1 record(s) logged past the checkpoint (offline runs cannot be rewound)" in line
    assert f"{SEGMENT_KEY}=1" in line
    old, new = (history(folder) for folder in offline_runs(run_dir))
    assert [(row["step"], row[SEGMENT_KEY]) for row in old] == [(100, 0), (200, 0)]
    assert [(row["step"], row[SEGMENT_KEY]) for row in new] == [(200, 1)]


def test_online_a_resume_rewinds_the_wandb_run_to_the_checkpoints_step(tmp_path, monkeypatch, caplog):
    """No network here: the kwargs wandb.init would get. A server that refuses rewind
    (a preview feature) is resumed as before, said in one line, rows marked."""
    import torchrl.record.loggers.wandb as torchrl_wandb

    opened, refuse = [], []

    class Spy:
        def __init__(self, *args, **kwargs):
            opened.append(kwargs)
            if kwargs.get("resume_from") and refuse:
                raise RuntimeError("rewind is not enabled for this entity")

    monkeypatch.setattr(torchrl_wandb, "WandbLogger", Spy)
    saved = {"backend": "wandb", "mode": "online", "history_step": 42,
             "local": {"id": "abcd1234", "step_registry": {}}}
    logger = _logger(tmp_path, backend="wandb", mode="online", saved_state=saved)
    assert opened[-1]["resume_from"] == "abcd1234?_step=42" and opened[-1]["resume"] is None
    assert opened[-1]["id"] == "abcd1234" and logger.rewound_on_server

    refuse.append(True)
    logger = _logger(tmp_path, backend="wandb", mode="online", saved_state=saved)
    assert [k.get("resume") for k in opened[-2:]] == [None, "must"] and not logger.rewound_on_server
    assert logger.segment == 1  # the second start of this run directory
    assert json.loads((tmp_path / "wandb_run.json").read_text()) == {"run_id": "abcd1234", "attempts": 2}
    logger.logger = None  # the spy cannot log; the rewind's line is what is checked
    logger._is_wandb = lambda: True
    (tmp_path / "metrics.jsonl").write_text('{"frames": 1, "updates": 1}\n{"frames": 2, "updates": 2}\n')
    logger.rewind(updates=1)
    assert "W&B refused resume_from: rewind is not enabled for this entity" in caplog.text


@pytest.mark.e2e
def test_after_a_crash_past_a_mid_batch_checkpoint_and_a_resume_the_records_agree(tmp_path):
    """A run crashed after a checkpoint that shares its frame count with later records
    (checkpoints every 15 updates, ~25 updates per collector batch): what it logged
    past the checkpoint is still on disk, as a kill -9 leaves it. The resumed run's
    metrics.jsonl and CSVs must hold the same records, none twice."""
    run_dir = tmp_path / "run"
    first = start(*FAST_STATES, "train.train_ratio=40", f"hydra.run.dir={run_dir}", "train.total_frames=300",
                  "checkpoint.every=15", "checkpoint.keep=100", "logger.log_every=5", "eval.every=100000")
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]
    records = read_metrics(run_dir)

    def shares_frames(path):
        counters = ckpt._read(path)["counters"]
        return any(r["frames"] == counters["frames"] and r["updates"] > counters["updates"] for r in records)

    crash_point = next(p for p in ckpt.list_checkpoints(run_dir)[:-1] if shares_frames(p))
    for later in ckpt.list_checkpoints(run_dir):
        if later > crash_point:
            later.unlink()  # the state a kill -9 right after crash_point leaves
    resumed = start(f"resume={run_dir}", "logger.progress_bar=false", f"hydra.run.dir={tmp_path / 'h'}")
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]
    assert_records_agree(run_dir)
    assert "records rewound to the checkpoint" in out + err

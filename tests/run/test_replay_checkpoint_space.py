"""checkpoint.replay=true: a disk check before each write and at start, and checkpoints
that hold only the filled part of the replay buffer (restored exactly)."""

from __future__ import annotations

import collections
import shutil

import pytest
import torch
from tensordict import TensorDict

from dreamer.data.replay import load_replay_state, make_replay_buffer, replay_state, write
from dreamer.errors import UserError
from dreamer.run import checkpoint as ckpt
from tests.support.configs import tiny_config
from tests.support.gpu_checks import REPLAY_CUDA

OBS = "observation"


def _steps(n: int, start: int, traj: int = 0) -> TensorDict:
    """n collected steps of one trajectory, every value telling which step it is."""
    index = torch.arange(start, start + n)
    return TensorDict({
        OBS: (index.float() - 1).unsqueeze(-1).expand(n, 64).contiguous(),  # the reset's at step 0
        ("next", OBS): index.float().unsqueeze(-1).expand(n, 64).contiguous(),
        "action": index.float().unsqueeze(-1),
        ("next", "reward"): -index.float().unsqueeze(-1),
        ("next", "done"): torch.zeros(n, 1, dtype=torch.bool),
        ("next", "terminated"): torch.zeros(n, 1, dtype=torch.bool),
        ("next", "truncated"): torch.zeros(n, 1, dtype=torch.bool),
        ("collector", "traj_ids"): torch.full((n,), traj),
        "step_count": index.unsqueeze(-1),
    }, [n])


def _buffer(capacity: int = 2000):
    cfg = tiny_config()
    cfg.buffer.capacity = capacity
    return make_replay_buffer(cfg.buffer, torch.device("cpu"))


def _free(monkeypatch, free_bytes: int) -> None:
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(free_bytes * 2, free_bytes, free_bytes))


def test_a_checkpoint_of_a_partly_filled_buffer_holds_only_the_filled_part(tmp_path):
    full = _buffer()
    write(full, _steps(2000, 0), OBS)
    partial = _buffer()
    write(partial, _steps(100, 0), OBS)
    full_path = ckpt.save_checkpoint(tmp_path / "full", {"replay": replay_state(full)}, updates=1, keep=1)
    full_size = full_path.stat().st_size
    path = ckpt.save_checkpoint(tmp_path / "partial", {"replay": replay_state(partial)}, updates=1, keep=1)
    assert path.stat().st_size < full_size / 10  # 5% of the rows, not the whole preallocated storage


@pytest.mark.parametrize("written", [100, 2000, 2300])  # partly filled, exactly full, wrapped
def test_a_replay_checkpoint_restores_the_buffer_exactly(tmp_path, written):
    original = _buffer()
    write(original, _steps(min(written, 1500), 0), OBS)
    if written > 1500:
        write(original, _steps(written - 1500, 1500, traj=1), OBS)
    ckpt.save_checkpoint(tmp_path, {"replay": replay_state(original)}, updates=1, keep=1)
    restored = _buffer()
    load_replay_state(restored, ckpt.load_latest(tmp_path)["replay"])
    assert len(restored) == len(original)
    live, saved = restored._storage._storage, original._storage._storage
    assert live.shape == saved.shape == torch.Size([2000])  # the full capacity, ready for more
    n = len(original)  # rows past it were never written
    assert (live[:n] == saved[:n]).all()
    assert restored._writer.state_dict() == original._writer.state_dict()
    # Both continue alike: the next write lands at the same rows, the samples come from them.
    for buffer in (original, restored):
        write(buffer, _steps(50, 5000, traj=2), OBS)
    n = len(original)
    assert len(restored) == n and (restored._storage._storage[:n] == original._storage._storage[:n]).all()
    assert restored.sample()[("next", OBS)].shape == torch.Size([10, 64])


def test_a_checkpoint_the_disk_cannot_hold_is_refused_before_writing(tmp_path, monkeypatch):
    buffer = _buffer()
    write(buffer, _steps(2000, 0), OBS)
    previous = ckpt.save_checkpoint(tmp_path, {"tag": 1}, updates=1, keep=3)
    _free(monkeypatch, 20 * 2**20)
    big = {"replay": replay_state(buffer), "weights": torch.zeros(8 * 2**20)}  # 0.5 MiB of replay, 32 MiB of weights
    with pytest.raises(ckpt.CheckpointWriteError) as err:
        ckpt.save_checkpoint(tmp_path, big, updates=2, keep=3)
    message = str(err.value)
    assert "\n" not in message and "needs about" in message and "0.02 GiB free" in message
    assert f"the previous checkpoint {previous} is intact" in message
    assert ckpt.list_checkpoints(tmp_path) == [previous]
    assert not list((tmp_path / ckpt.CHECKPOINT_DIR).glob(".*tmp"))


def test_a_replay_checkpoint_that_cannot_fit_once_is_refused_at_start(tmp_path, monkeypatch):
    """Said at start (one line, exit 2 from the entry point), not after hours of training."""
    from dreamer.run.build import build_run

    cfg = tiny_config()
    cfg.eval.video = False
    cfg.checkpoint.replay = True
    cfg.buffer.capacity = 100_000  # ~20 MB of state steps
    _free(monkeypatch, 2 * 2**20)
    with pytest.raises(UserError) as err:
        build_run(cfg, tmp_path)
    message = str(err.value)
    assert "\n" not in message and message.startswith("checkpoint.replay=true: a checkpoint with the full replay")
    assert "3 of them at peak with checkpoint.keep=2" in message and "set checkpoint.replay=false" in message
    assert not (tmp_path / "config.json").exists() and not (tmp_path / ckpt.CHECKPOINT_DIR).exists()


def test_keep_plus_one_replay_checkpoints_that_would_not_fit_are_one_warning_at_start(tmp_path, monkeypatch, caplog):
    from dreamer.run import preflight
    from dreamer.run.build import build_run

    cfg = tiny_config()
    cfg.eval.video = False
    cfg.checkpoint.replay = True
    cfg.buffer.capacity = 100_000
    replay_bytes = {}
    real = preflight.ckpt.check_replay_checkpoint_space

    def measure(run_dir, replay, model, keep):
        replay_bytes["one"] = ckpt._with_framing(replay + model)
        _free(monkeypatch, 2 * replay_bytes["one"])  # room for two, not keep+1 = 3
        return real(run_dir, replay, model, keep)

    monkeypatch.setattr(preflight.ckpt, "check_replay_checkpoint_space", measure)
    build_run(cfg, tmp_path).close()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "replay" in r.getMessage()]
    assert len(warnings) == 1 and "checkpoints will fail once the buffer fills" in warnings[0]


@pytest.mark.cuda(REPLAY_CUDA)
def test_a_filled_part_restored_into_page_locked_storage_stays_page_locked(tmp_path):
    cfg = tiny_config()
    cfg.buffer.capacity, cfg.buffer.pin_memory = 2000, "on"
    original = make_replay_buffer(cfg.buffer, torch.device("cuda"))
    write(original, _steps(100, 0), OBS)
    ckpt.save_checkpoint(tmp_path, {"replay": replay_state(original)}, updates=1, keep=1)
    restored = make_replay_buffer(cfg.buffer, torch.device("cuda"))
    load_replay_state(restored, ckpt.load_latest(tmp_path)["replay"])
    live = restored._storage._storage
    assert live.shape == torch.Size([2000]) and live[("next", OBS)].is_pinned()
    assert (live[:100] == original._storage._storage[:100]).all()
    assert restored.sample()[("next", OBS)].device.type == "cuda"

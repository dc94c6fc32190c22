"""dreamer/run/checkpoint.py: atomic writes, rotation, newest-readable load, RNG state."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from dreamer.errors import UserError
from dreamer.run import checkpoint as ckpt
from tests.support.gpu_checks import CHECKPOINT_RESUME
from tests.support.runs import write_sealed


def _state(tag: int) -> dict:
    return {"tag": tag, "weights": torch.full((4, 4), float(tag)), "nested": {"step": tag}}


def _files(run_dir):
    return sorted(p.name for p in (run_dir / ckpt.CHECKPOINT_DIR).iterdir())


def test_save_then_load_latest_round_trip(tmp_path):
    path = ckpt.save_checkpoint(tmp_path, _state(3), updates=3, keep=2)
    assert path.is_file()
    assert path.parent == tmp_path / ckpt.CHECKPOINT_DIR
    loaded = ckpt.load_latest(tmp_path)
    assert loaded["tag"] == 3
    assert torch.equal(loaded["weights"], _state(3)["weights"])
    assert loaded["nested"] == {"step": 3}


def test_failed_save_leaves_previous_checkpoint_and_no_partial_files(tmp_path, monkeypatch):
    ckpt.save_checkpoint(tmp_path, _state(1), updates=10, keep=3)
    before = _files(tmp_path)

    real_save = torch.save

    def crash_mid_write(obj, f, *args, **kwargs):
        f.write(b"PARTIAL-CHECKPOINT-BYTES" * 100)  # some bytes reach the file...
        raise OSError(28, "disk full")  # ...then the write dies (ENOSPC)

    monkeypatch.setattr(torch, "save", crash_mid_write)
    with pytest.raises(ckpt.CheckpointWriteError) as err:
        ckpt.save_checkpoint(tmp_path, _state(2), updates=20, keep=3)
    # One line naming the failed file, the reason and the checkpoint that survived.
    assert "ckpt_0000000020.pt (disk full)" in str(err.value)
    assert f"the previous checkpoint {ckpt.list_checkpoints(tmp_path)[-1]} is intact" in str(err.value)
    monkeypatch.setattr(torch, "save", real_save)

    # Nothing new: no ckpt_*20.pt, no temp file, the old one untouched.
    assert _files(tmp_path) == before
    assert not list((tmp_path / ckpt.CHECKPOINT_DIR).glob("*tmp*"))
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == before
    assert ckpt.load_latest(tmp_path)["tag"] == 1


def test_checkpoint_carries_a_manifest(tmp_path):
    import torchrl

    config = {"buffer": {"batch_size": 4}, "seed": 0}
    ckpt.save_checkpoint(tmp_path, {"config": config}, updates=42, keep=1)
    manifest = ckpt.load_latest(tmp_path)["manifest"]
    assert manifest["updates"] == 42
    assert manifest["config_hash"] == ckpt.config_hash({"seed": 0, "buffer": {"batch_size": 4}})
    assert manifest["torch"] == torch.__version__ and manifest["torchrl"] == torchrl.__version__


def test_a_manifest_that_does_not_match_its_config_falls_back(tmp_path, capsys):
    ckpt.save_checkpoint(tmp_path, {"config": {"seed": 1}, "tag": 1}, updates=1, keep=3)
    newest = ckpt.save_checkpoint(tmp_path, {"config": {"seed": 2}, "tag": 2}, updates=2, keep=3)
    state = torch.load(newest, weights_only=False)
    state["config"]["seed"] = 3  # the stored config no longer matches what was hashed
    write_sealed(newest, state)
    assert ckpt.load_latest(tmp_path)["tag"] == 1
    assert str(newest) in capsys.readouterr().err


def test_a_stale_temp_file_from_a_killed_write_is_cleaned_up(tmp_path):
    ckpt.save_checkpoint(tmp_path, _state(1), updates=1, keep=3)
    stale = tmp_path / ckpt.CHECKPOINT_DIR / ".ckpt_0000000002.pt.tmp"
    stale.write_bytes(b"half a checkpoint")
    ckpt.save_checkpoint(tmp_path, _state(3), updates=3, keep=3)
    assert not stale.exists()


def test_rotation_keeps_the_newest(tmp_path):
    for updates in (5, 50, 500, 5000, 50000):
        ckpt.save_checkpoint(tmp_path, _state(updates), updates=updates, keep=2)
    names = [p.name for p in ckpt.list_checkpoints(tmp_path)]
    assert len(names) == 2
    # Ordered by update count, not by string length or mtime.
    assert ckpt.load_latest(tmp_path)["tag"] == 50000
    assert [torch.load(p, weights_only=False)["tag"] for p in ckpt.list_checkpoints(tmp_path)] == [5000, 50000]
    assert set(_files(tmp_path)) == set(names)


@pytest.mark.parametrize("keep", [1, 3])
def test_rotation_respects_keep(tmp_path, keep):
    for updates in range(1, 6):
        ckpt.save_checkpoint(tmp_path, _state(updates), updates=updates, keep=keep)
    tags = [torch.load(p, weights_only=False)["tag"] for p in ckpt.list_checkpoints(tmp_path)]
    assert tags == list(range(6 - keep, 6))


def test_load_latest_falls_back_when_newest_is_truncated(tmp_path, capsys):
    ckpt.save_checkpoint(tmp_path, _state(1), updates=100, keep=3)
    newest = ckpt.save_checkpoint(tmp_path, _state(2), updates=200, keep=3)
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 3])  # truncated by a crash / full disk
    assert ckpt.load_latest(tmp_path)["tag"] == 1
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1 and warning[0].startswith("warning: ")
    assert str(newest) in warning[0]  # the user is told which file was skipped


def test_load_latest_falls_back_when_newest_is_garbage(tmp_path):
    ckpt.save_checkpoint(tmp_path, _state(1), updates=1, keep=3)
    newest = ckpt.save_checkpoint(tmp_path, _state(2), updates=2, keep=3)
    newest.write_bytes(b"\x00garbage\xff" * 10)
    assert ckpt.load_latest(tmp_path)["tag"] == 1


def test_load_latest_without_checkpoints_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no checkpoint"):
        ckpt.load_latest(tmp_path)
    (tmp_path / ckpt.CHECKPOINT_DIR).mkdir()
    (tmp_path / ckpt.CHECKPOINT_DIR / ".ckpt_0000000001.pt.tmp").write_bytes(b"partial")
    with pytest.raises(UserError, match="no checkpoint"):
        ckpt.load_latest(tmp_path)


def test_load_latest_all_unreadable_is_a_user_error(tmp_path):
    path = ckpt.save_checkpoint(tmp_path, _state(1), updates=1, keep=3)
    path.write_bytes(b"nope")
    with pytest.raises(UserError, match="unreadable"):
        ckpt.load_latest(tmp_path)


def _draws():
    return (torch.rand(5), np.random.rand(5), [random.random() for _ in range(5)])


def test_rng_state_round_trip_reproduces_draws():
    torch.manual_seed(123)
    np.random.seed(123)
    random.seed(123)
    _draws()
    state = ckpt.rng_state()
    first = _draws()
    _draws()  # move every generator on
    ckpt.set_rng_state(state)
    again = _draws()
    assert torch.equal(first[0], again[0])
    assert np.array_equal(first[1], again[1])
    assert first[2] == again[2]


@pytest.mark.gpu_acceptance(CHECKPOINT_RESUME)
def test_rng_state_survives_a_checkpoint(tmp_path):
    torch.manual_seed(7)
    np.random.seed(7)
    random.seed(7)
    ckpt.save_checkpoint(tmp_path, {"rng": ckpt.rng_state()}, updates=1, keep=1)
    expected = _draws()
    torch.manual_seed(999)
    np.random.seed(999)
    random.seed(999)
    ckpt.set_rng_state(ckpt.load_latest(tmp_path)["rng"])
    again = _draws()
    assert torch.equal(again[0], expected[0]) and np.array_equal(again[1], expected[1]) and again[2] == expected[2]


class _RunsCode:
    """What a hostile checkpoint could hold: unpickling it runs a command."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_a_checkpoint_that_would_run_code_is_refused_in_one_line(tmp_path):
    ckpt.save_checkpoint(tmp_path, _state(1), updates=1, keep=3)
    marker = tmp_path / "pwned"
    hostile = tmp_path / ckpt.CHECKPOINT_DIR / "ckpt_0000000002.pt"
    write_sealed(hostile, {**_state(2), "payload": _RunsCode(marker)})  # a seal anyone can forge
    with pytest.raises(ckpt.UnsafeCheckpoint) as err:
        ckpt.load_latest(tmp_path)
    message = str(err.value)
    assert "\n" not in message and str(hostile) in message and "refused" in message
    assert not marker.exists()  # nothing ran, and the run did not fall back to an older file silently


def test_checkpoints_hold_only_what_weights_only_loading_accepts(tmp_path):
    torch.manual_seed(0)
    ckpt.save_checkpoint(tmp_path, {"rng": ckpt.rng_state(), **_state(1)}, updates=1, keep=1)
    path = ckpt.list_checkpoints(tmp_path)[-1]
    state = torch.load(path, weights_only=True)  # no safe-globals allowance needed
    assert isinstance(state["rng"]["numpy"]["keys"], torch.Tensor)


@pytest.mark.gpu_acceptance(CHECKPOINT_RESUME)
def test_a_checkpoint_from_an_8_gpu_job_resumes_where_fewer_are_visible(tmp_path, capsys):
    """Requeued onto a smaller node (or onto CPU): the CUDA streams that fit are
    restored, the rest are reported once; nothing fails."""
    torch.manual_seed(3)
    state = ckpt.rng_state()
    state["cuda"] = [torch.zeros(16, dtype=torch.uint8) for _ in range(8)]  # as get_rng_state_all() on 8 GPUs
    ckpt.save_checkpoint(tmp_path, {"rng": state}, updates=1, keep=1)
    expected = torch.rand(4)
    ckpt.set_rng_state(ckpt.load_latest(tmp_path)["rng"])
    assert torch.equal(torch.rand(4), expected)
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert f"8 CUDA RNG stream(s) and {visible} CUDA device(s) are visible" in capsys.readouterr().err


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_a_full_disk_mid_checkpoint_keeps_the_previous_one_end_to_end(tmp_path):
    """The OS refuses the write for real (a file-size limit, as a full disk would); no patching."""
    import hashlib
    import resource

    from tests.support.processes import FAST, start

    run_dir = tmp_path / "run"
    first = start(*FAST, f"hydra.run.dir={run_dir}", "train.total_frames=300", "eval.every=1000")
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]
    previous = ckpt.list_checkpoints(run_dir)[-1]
    digest = hashlib.sha256(previous.read_bytes()).hexdigest()

    # With the filled part of the replay buffer (hundreds of 64x64 pixel steps, megabytes) a
    # checkpoint no longer fits under a file-size limit 1 MiB above one without it.
    limit = previous.stat().st_size + 2**20
    resumed = start(f"resume={run_dir}", "train.total_frames=600", "checkpoint.replay=true", "checkpoint.every=10",
                    "logger.progress_bar=false", f"hydra.run.dir={tmp_path / 'h'}",
                    preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 2
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert last.startswith("error: could not write checkpoint") and "File too large" in last
    assert f"the previous checkpoint {previous} is intact" in last
    assert ckpt.list_checkpoints(run_dir)[-1] == previous
    assert hashlib.sha256(previous.read_bytes()).hexdigest() == digest
    assert not list((run_dir / ckpt.CHECKPOINT_DIR).glob(".*tmp"))


def test_loading_a_checkpoint_maps_it_instead_of_copying_it_into_ram(tmp_path):
    """A checkpoint with the replay buffer is as large as the buffer: loaded, it is
    mapped (the tensors are read as the live storage copies them), not held a second
    time in RAM beside the buffer it is restored into."""
    import gc

    import psutil

    ckpt.save_checkpoint(tmp_path, {"replay": torch.ones(50_000_000)}, updates=1, keep=1)  # 200 MB
    gc.collect()
    rss = psutil.Process().memory_info().rss
    state = ckpt.load_latest(tmp_path)
    grew_mib = (psutil.Process().memory_info().rss - rss) / 2**20
    assert grew_mib < 50, f"loading read {grew_mib:.0f} MiB of a 191 MiB checkpoint into memory"
    assert float(state["replay"][-1]) == 1.0  # and the data is there when read

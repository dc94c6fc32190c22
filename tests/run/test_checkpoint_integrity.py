"""Checkpoint corruption and hostile files: a content digest checked at load, corrupt files
moved aside (not rotated, never resumed), loads bounded by the file's size on disk."""

from __future__ import annotations

import gc
import io
import pickle
import struct
import zipfile

import psutil
import pytest
import torch

from dreamer.errors import UserError
from dreamer.run import checkpoint as ckpt
from dreamer.run import integrity


def _state(tag: int) -> dict:
    return {"tag": tag, "weights": torch.full((64, 64), float(tag)), "nested": {"step": tag}}


def _entry_offset(path, suffix: str) -> int:
    """Where the bytes of the zip entry whose name ends with ``suffix`` start in the file."""
    with zipfile.ZipFile(path) as archive:
        (info,) = [i for i in archive.infolist() if i.filename.endswith(suffix)]
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        header = f.read(30)
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_len + extra_len


def _flip(path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def _warnings(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_a_flipped_byte_inside_tensor_data_is_found_and_the_file_moved_aside(tmp_path, capsys):
    ckpt.save_checkpoint(tmp_path, _state(1), updates=1, keep=3)
    newest = ckpt.save_checkpoint(tmp_path, _state(2), updates=2, keep=3)
    _flip(newest, _entry_offset(newest, "data/0") + 100)  # one bit of one float of "weights"
    state = ckpt.load_latest(tmp_path)
    assert state["tag"] == 1 and torch.equal(state["weights"], _state(1)["weights"])
    (line,) = _warnings(capsys)
    assert line.startswith(f"warning: checkpoint {newest} is unreadable") and "sha256" in line
    assert "moved aside to ckpt_0000000002.pt.corrupt" in line
    assert not newest.exists() and newest.with_name(newest.name + ".corrupt").exists()
    assert ckpt.list_checkpoints(tmp_path) == [tmp_path / ckpt.CHECKPOINT_DIR / "ckpt_0000000001.pt"]


def test_a_flipped_byte_in_the_pickled_structure_is_found(tmp_path, capsys):
    ckpt.save_checkpoint(tmp_path, _state(1), updates=1, keep=3)
    newest = ckpt.save_checkpoint(tmp_path, _state(2), updates=2, keep=3)
    offset = _entry_offset(newest, "data.pkl")
    data = newest.read_bytes()
    # The "step" value 2 in {"nested": {"step": 2}}: BININT1 2 -> BININT1 3, still a valid pickle.
    at = data.index(b"step", offset)
    binint1 = data.index(b"K\x02", at)
    _flip(newest, binint1 + 1)
    assert ckpt.load_latest(tmp_path)["nested"] == {"step": 1}
    assert "sha256" in _warnings(capsys)[0]


def test_a_truncated_checkpoint_is_moved_aside(tmp_path, capsys):
    ckpt.save_checkpoint(tmp_path, _state(1), updates=1, keep=3)
    newest = ckpt.save_checkpoint(tmp_path, _state(2), updates=2, keep=3)
    newest.write_bytes(newest.read_bytes()[:-3000])
    assert ckpt.load_latest(tmp_path)["tag"] == 1
    (line,) = _warnings(capsys)
    assert "moved aside" in line and not newest.exists()


def test_rotation_after_a_corrupt_newest_keeps_two_good_checkpoints_and_no_way_back(tmp_path, capsys):
    """keep=2 with a corrupt newest: the resumed run's next checkpoint must leave two
    good ones, not the corrupt file plus one; and no later resume can load the
    abandoned checkpoint again (it is not a checkpoint any more)."""
    ckpt.save_checkpoint(tmp_path, _state(1), updates=100, keep=2)
    abandoned = ckpt.save_checkpoint(tmp_path, _state(2), updates=200, keep=2)
    abandoned.write_bytes(abandoned.read_bytes()[:-3000])
    assert ckpt.load_latest(tmp_path)["tag"] == 1  # the resume continues from update 100
    ckpt.save_checkpoint(tmp_path, _state(3), updates=150, keep=2)
    kept = ckpt.list_checkpoints(tmp_path)
    assert [p.name for p in kept] == ["ckpt_0000000100.pt", "ckpt_0000000150.pt"]
    assert [ckpt._read(p)["tag"] for p in kept] == [1, 3]
    abandoned.with_name(abandoned.name + ".corrupt").replace(abandoned.with_name("x"))  # even if readable again
    assert ckpt.load_latest(tmp_path)["tag"] == 3


def test_every_checkpoint_corrupt_is_one_line_and_moves_nothing(tmp_path, capsys):
    """A refused resume changes nothing: the files stay where they are, to be restored or inspected."""
    path = ckpt.save_checkpoint(tmp_path, _state(1), updates=1, keep=3)
    _flip(path, _entry_offset(path, "data/0"))
    with pytest.raises(UserError, match=r"every checkpoint is unreadable \(ckpt_0000000001.pt: CorruptFile: .*"
                                        r"nothing was moved") as err:
        ckpt.load_latest(tmp_path)
    assert "\n" not in str(err.value)
    assert ckpt.list_checkpoints(tmp_path) == [path] and not list(tmp_path.rglob("*.corrupt"))


def test_the_digest_is_written_with_the_file_and_plain_readers_still_read_it(tmp_path):
    path = ckpt.save_checkpoint(tmp_path, _state(5), updates=5, keep=1)
    with zipfile.ZipFile(path) as archive:
        assert archive.comment.startswith(integrity.DIGEST_PREFIX)
        assert archive.testzip() is None
    digest = integrity.check(path)
    assert digest == integrity.file_digest(path, path.stat().st_size - len(archive.comment) - 2)
    assert torch.load(path, weights_only=True)["tag"] == 5  # torch reads it as any checkpoint


def test_a_file_without_a_digest_is_not_resumed(tmp_path, capsys):
    ckpt.save_checkpoint(tmp_path, _state(1), updates=1, keep=3)
    unsealed = tmp_path / ckpt.CHECKPOINT_DIR / "ckpt_0000000007.pt"
    torch.save(_state(7), unsealed)  # a plain torch.save: no digest comment
    with pytest.raises(integrity.CorruptFile, match="no sealed digest"):
        integrity.check(unsealed)
    assert ckpt.load_latest(tmp_path)["tag"] == 1
    assert not unsealed.exists() and str(unsealed) in capsys.readouterr().err


def _deflated_bomb(path, size: int) -> None:
    """A checkpoint-shaped zip whose data.pkl is a pickled ``size``-byte string, deflated."""
    genuine = io.BytesIO()
    torch.save({"tag": 1}, genuine)
    with zipfile.ZipFile(genuine) as src, zipfile.ZipFile(path, "w") as out:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("data.pkl"):
                out.writestr(info.filename, pickle.dumps({"tag": "a" * size}, protocol=2),
                             compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
            else:
                out.writestr(info.filename, data)


def test_a_crafted_zip_that_inflates_in_memory_is_refused_before_loading(tmp_path):
    """A 98 KB file whose deflated data.pkl is a 100 MB string: refused in one line
    from the zip's central directory, nothing inflated."""
    directory = tmp_path / ckpt.CHECKPOINT_DIR
    directory.mkdir()
    bomb = directory / "ckpt_0000000001.pt"
    _deflated_bomb(bomb, 100 * 2**20)
    assert bomb.stat().st_size < 110 * 2**10
    gc.collect()
    rss = psutil.Process().memory_info().rss
    with pytest.raises(ckpt.UnsafeCheckpoint) as err:
        ckpt.load_latest(tmp_path)
    grew_mib = (psutil.Process().memory_info().rss - rss) / 2**20
    assert grew_mib < 20, f"loading the bomb took {grew_mib:.0f} MiB"
    message = str(err.value)
    assert "\n" not in message and str(bomb) in message and "refused" in message and "compressed" in message
    assert bomb.exists()  # someone else's file: refused, not moved


def test_running_out_of_memory_while_loading_is_said_not_skipped(tmp_path, monkeypatch):
    """A MemoryError is the machine's, not the file's: falling back to an older checkpoint
    would silently go back in the run's timeline."""
    ckpt.save_checkpoint(tmp_path, _state(1), updates=1, keep=3)
    newest = ckpt.save_checkpoint(tmp_path, _state(2), updates=2, keep=3)

    def no_memory(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(torch, "load", no_memory)
    with pytest.raises(UserError, match=r"ran out of memory loading .*ckpt_0000000002.pt.*left as it is"):
        ckpt.load_latest(tmp_path)
    assert newest.exists() and len(ckpt.list_checkpoints(tmp_path)) == 2

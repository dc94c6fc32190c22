"""dreamer/run/preflight.py: every check a run makes before it creates anything, reading only."""

from __future__ import annotations

import pytest
import torch

from dreamer.config import load_config
from dreamer.errors import UserError
from dreamer.run import checkpoint as ckpt
from dreamer.run import preflight
from dreamer.run.preflight import check_dir_can_be_written, check_run
from tests.support.runs import saved_run


def _files(root) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_resume_is_checked_without_writing_and_lists_what_the_run_will_move_aside(tmp_path):
    run_dir = saved_run(tmp_path / "run")
    newest = ckpt.save_checkpoint(run_dir, {"config": {}, "counters": {"frames": 300}}, updates=2, keep=3)
    newest.write_bytes(b"torn")
    before = _files(tmp_path)
    checked = check_run(load_config({"resume": str(run_dir), "train": {"total_frames": 40000}}),
                        {"resume", "train.total_frames"})
    assert checked.run_dir == run_dir and checked.cfg.train.total_frames == 40000
    assert checked.resumed_state["path"] == str(ckpt.list_checkpoints(run_dir)[0])
    assert [path for path, _ in checked.resumed_state["unreadable"]] == [str(newest)]
    assert _files(tmp_path) == before  # moved aside only by the run, once it holds the lock
    ckpt.set_aside_unreadable(checked.resumed_state)
    assert not newest.exists() and newest.with_name(newest.name + ".corrupt").exists()


def test_this_machine_is_measured_with_one_env_and_left_alone_when_asked(monkeypatch):
    built = []
    real = preflight.make_env
    monkeypatch.setattr(preflight, "make_env", lambda *a, **k: built.append(1) or real(*a, **k))
    here = check_run(load_config({}))
    assert built == [1] and here.device is not None and here.step_bytes > 0
    elsewhere = check_run(load_config({"device": "cuda:7"}), this_machine=False)
    assert built == [1] and elsewhere.device is None and elsewhere.step_bytes is None


def test_a_directory_to_be_created_is_tried_where_it_would_be_made_and_nothing_is_made(tmp_path):
    check_dir_can_be_written(tmp_path / "a" / "b" / "run", "hydra.run.dir")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match=r"hydra.run.dir=.*/file/run cannot be written \(Not a directory\)"):
        check_dir_can_be_written(tmp_path / "file" / "run", "hydra.run.dir")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is there: device=cuda is no mistake here")
def test_the_device_is_checked_before_the_env_is_built(monkeypatch):
    monkeypatch.setattr(preflight, "make_env", lambda *a, **k: pytest.fail("built an env for a run it refuses"))
    with pytest.raises(UserError, match="device=cuda but"):
        check_run(load_config({"device": "cuda"}))

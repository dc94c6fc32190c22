"""A compile-cache file is unpickled by torch on a cache hit: a resumed run loads its
run directory's compile_cache.bin only when the checkpoint vouches for it (sha256),
and a compile.cache_artifact kept from the saved config never breaks a resume."""

from __future__ import annotations

import hashlib
import logging

import pytest
import torch

from dreamer.errors import UserError
from dreamer.run import checkpoint as ckpt
from dreamer.run.build import build_run
from dreamer.system import compile_cache
from tests.support.configs import tiny_config


@pytest.fixture
def loaded(monkeypatch):
    """The bytes handed to torch.compiler.load_cache_artifacts (torch itself never sees them)."""
    calls = []

    def spy(data):
        calls.append(bytes(data))
        return None  # "torch could not read it": nothing enters the caches

    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", spy)
    return calls


def _config(compile_on: bool = True):
    cfg = tiny_config()
    cfg.eval.video = False
    cfg.compile.enabled = compile_on
    cfg.compile.background = False
    return cfg


def _first_run(run_dir, monkeypatch, artifact: bytes | None = None, compile_on: bool = True, **compile_keys):
    """A run that wrote its checkpoint (and, given ``artifact``, its compile_cache.bin first)."""
    cfg = _config(compile_on)
    for key, value in compile_keys.items():
        setattr(cfg.compile, key, value)
    run = build_run(cfg, run_dir)
    try:
        if artifact is not None:
            monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (artifact, None))
            run.save_compile_artifact()
        run.save()
    finally:
        run.close()


def _resume(run_dir, overridden=frozenset(), **compile_keys):
    cfg = _config()
    cfg.resume = str(run_dir)
    for key, value in compile_keys.items():
        setattr(cfg.compile, key, value)
    return build_run(cfg, run_dir, overridden=set(overridden))


def test_a_compile_cache_planted_in_a_run_dir_is_never_unpickled(tmp_path, monkeypatch, loaded, caplog):
    _first_run(tmp_path, monkeypatch)  # compiled nothing: no artifact, nothing vouched for
    (tmp_path / compile_cache.ARTIFACT_NAME).write_bytes(b"someone else's pickles")
    caplog.set_level(logging.INFO, "dreamer")
    _resume(tmp_path).close()
    assert loaded == []
    lines = [r.getMessage() for r in caplog.records if "compile cache" in r.getMessage()]
    assert len(lines) == 1 and "not loaded: the checkpoint records no sha256" in lines[0]


def test_the_runs_own_compile_cache_is_loaded_when_the_checkpoint_vouches_for_it(tmp_path, monkeypatch, loaded):
    _first_run(tmp_path, monkeypatch, artifact=b"our compiled graphs")
    assert ckpt.load_latest(tmp_path)["compile_artifact_sha256"] == hashlib.sha256(b"our compiled graphs").hexdigest()
    _resume(tmp_path).close()
    assert loaded == [b"our compiled graphs"]


def test_a_compile_cache_swapped_after_the_checkpoint_is_skipped(tmp_path, monkeypatch, loaded, caplog):
    _first_run(tmp_path, monkeypatch, artifact=b"our compiled graphs")
    (tmp_path / compile_cache.ARTIFACT_NAME).write_bytes(b"our compiled graphz")
    _resume(tmp_path).close()
    assert loaded == []
    assert "its sha256 differs from the one the checkpoint records" in caplog.text


def test_a_vouched_artifact_stays_vouched_across_resumes(tmp_path, monkeypatch, loaded):
    """A resume that loads its own checked artifact records its digest again in its next checkpoint."""
    _first_run(tmp_path, monkeypatch, artifact=b"graphs")
    run = _resume(tmp_path)
    try:
        run.save()
    finally:
        run.close()
    assert ckpt.load_latest(tmp_path)["compile_artifact_sha256"] == hashlib.sha256(b"graphs").hexdigest()


def test_a_saved_cache_artifact_that_is_gone_is_one_warning_on_resume(tmp_path, monkeypatch, loaded, caplog):
    """The artifact named at the first start was on a node's scratch disk: the resume (or
    SLURM requeue) on another node warns once and compiles without it."""
    shared = tmp_path / "scratch" / "cache.bin"
    shared.parent.mkdir()
    shared.write_bytes(b"x")
    run_dir = tmp_path / "run"
    _first_run(run_dir, monkeypatch, compile_on=False, cache_artifact=str(shared))
    shared.unlink()
    caplog.set_level(logging.WARNING, "dreamer")
    _resume(run_dir).close()  # the saved config still names it
    warnings = [r.getMessage() for r in caplog.records
                if r.levelname == "WARNING" and "cache_artifact" in r.getMessage()]
    assert len(warnings) == 1 and "from the saved config" in warnings[0] and "no longer exists" in warnings[0]


def test_a_missing_cache_artifact_given_on_the_resume_command_line_is_an_error(tmp_path, monkeypatch):
    _first_run(tmp_path / "run", monkeypatch, compile_on=False)
    with pytest.raises(UserError, match=r"compile.cache_artifact=.*gone.bin does not exist"):
        _resume(tmp_path / "run", overridden={"compile.cache_artifact"}, cache_artifact=str(tmp_path / "gone.bin"))


def test_a_saved_cache_artifact_elsewhere_still_loads_on_resume(tmp_path, monkeypatch, loaded):
    shared = tmp_path / "shared.bin"
    shared.write_bytes(b"the user's artifact")
    _first_run(tmp_path / "run", monkeypatch, cache_artifact=str(shared))
    loaded.clear()
    _resume(tmp_path / "run").close()
    assert loaded == [b"the user's artifact"]


def test_a_saved_cache_artifact_inside_the_run_dir_loads_only_as_its_own(tmp_path, monkeypatch, loaded):
    """A checkpoint's config naming a file inside the directory it came in cannot get it
    loaded unchecked."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    planted = run_dir / "extra.bin"
    planted.write_bytes(b"planted")
    _first_run(run_dir, monkeypatch, cache_artifact=str(planted))
    loaded.clear()
    _resume(run_dir).close()
    assert loaded == []

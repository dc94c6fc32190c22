"""dreamer/run/resume.py: the saved config wins; allow-listed overrides only; foreign checkpoints refused."""

from __future__ import annotations

import json

import pytest
from helpers_unit import old_layout_config

from dreamer.config import Config, load_config, to_dict
from dreamer.errors import UserError
from dreamer.run import checkpoint as ckpt
from dreamer.run import resume


def _saved() -> dict:
    return to_dict(load_config({"buffer": {"batch_size": 4}, "train": {"total_frames": 600}}))


def _requested(**sections) -> Config:
    return load_config({"resume": "/runs/a", **sections})


def test_allow_listed_overrides_are_applied():
    cfg = resume.merge(_saved(), _requested(train={"total_frames": 900}, eval={"every": 7}))
    assert cfg.train.total_frames == 900 and cfg.eval.every == 7
    assert cfg.buffer.batch_size == 4  # from the saved config, not this invocation's default


def test_a_requeued_run_may_land_on_other_hardware():
    """device, collector.num_workers, threads and cuda_fast_math follow the machine the
    resumed job runs on (a GPU run resumed on CPU, fewer cores), not the saved run's."""
    saved = to_dict(load_config({"device": "cuda", "collector": {"num_workers": 7}, "threads": 9}))
    overrides = {"device": "cpu", "threads": 1, "cuda_fast_math": False}
    requested = load_config({"resume": "/runs/a", "collector": {"num_workers": 1}, **overrides})
    given = {"device", "threads", "cuda_fast_math", "collector.num_workers"}
    resume.refuse_overrides(saved, requested, given)  # accepted
    cfg = resume.merge(saved, requested)
    assert (cfg.device, cfg.collector.num_workers, cfg.threads, cfg.cuda_fast_math) == ("cpu", 1, 1, False)


def test_a_refused_override_names_the_key_and_both_values():
    with pytest.raises(UserError) as err:
        resume.refuse_overrides(_saved(), _requested(buffer={"batch_size": 8}), {"buffer.batch_size"})
    message = str(err.value)
    assert "refused override: buffer.batch_size (saved 4, given 8)" in message
    assert "Only train.total_frames, train.max_minutes, logger.*, eval.*, checkpoint.*, compile.cache_dir, compile.cache_artifact, profiling.*, retain_host_memory, device, collector.num_workers, threads, cuda_fast_math may change on resume" in message


def test_an_override_equal_to_the_saved_value_is_accepted():
    resume.refuse_overrides(_saved(), _requested(buffer={"batch_size": 4}), {"buffer.batch_size"})


def test_keys_not_given_on_the_command_line_never_count():
    # This invocation's defaults differ from the saved run everywhere; only what the user typed matters.
    resume.refuse_overrides(_saved(), _requested(buffer={"batch_size": 16}), {"train.total_frames"})


def test_an_override_inside_a_dict_valued_key_is_caught():
    requested = _requested(compile={"options": {"triton.cudagraphs": True}})
    with pytest.raises(UserError, match="compile.options"):
        resume.refuse_overrides(_saved(), requested, {"compile.options.triton.cudagraphs"})


def test_a_checkpoint_from_another_config_lists_the_differing_keys(tmp_path):
    run_config = _saved()
    (tmp_path / "config.json").write_text(json.dumps(run_config))
    foreign = json.loads(json.dumps(run_config))
    foreign["algo"]["hidden_dim"] = 64
    foreign["seed"] = 3
    foreign["eval"]["every"] = 1  # allow-listed: not a difference that matters
    ckpt.save_checkpoint(tmp_path, {"config": foreign}, updates=1, keep=1)
    with pytest.raises(UserError) as err:
        resume.open_run(load_config({"resume": str(tmp_path)}), set())
    assert "differing keys algo.hidden_dim, seed;" in str(err.value)
    assert "ckpt_0000000001.pt" in str(err.value)


def test_resume_of_a_missing_directory_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no such directory"):
        resume.open_run(load_config({"resume": str(tmp_path / "nope")}), set())


def test_a_fresh_run_refuses_a_directory_holding_checkpoints(tmp_path):
    resume.refuse_run_dir_with_checkpoints(tmp_path)  # empty: fine
    ckpt.save_checkpoint(tmp_path, {"config": _saved()}, updates=1, keep=1)
    with pytest.raises(UserError, match=f"continue it with resume={tmp_path}"):
        resume.refuse_run_dir_with_checkpoints(tmp_path)


@pytest.mark.parametrize("algo", ["dreamer_v1", "dreamer_v3"])
def test_a_run_saved_before_the_algo_split_resumes(tmp_path, algo):
    # Its config.json and checkpoints hold the old layout: channels_last at the
    # top, and the merged algo section with the other algorithm's keys.
    new = to_dict(load_config({"algo": {"name": algo}, "buffer": {"batch_size": 4}}))
    old = old_layout_config(new, channels_last=False)
    (tmp_path / "config.json").write_text(json.dumps(old))
    ckpt.save_checkpoint(tmp_path, {"config": old}, updates=1, keep=1)
    requested = load_config({"resume": str(tmp_path), "algo": {"name": algo}, "train": {"total_frames": 900}})
    _, cfg, _ = resume.open_run(requested, {"resume", "train.total_frames"})
    assert cfg.algo.name == algo and cfg.buffer.batch_size == 4 and cfg.train.total_frames == 900
    assert not hasattr(cfg, "channels_last")
    if algo == "dreamer_v1":
        assert cfg.algo.channels_last is False  # the saved value, moved into algo

"""dreamer/run/resume.py: the saved config wins; allow-listed overrides only; foreign checkpoints refused."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import typing

import pytest

from dreamer.config import Config, load_config, to_dict
from dreamer.config.load import config_key
from dreamer.errors import UserError
from dreamer.run import checkpoint as ckpt
from dreamer.run import resume
from tests.support.gpu_checks import CHECKPOINT_RESUME
from tests.support.paths import CONF_DIR


def _saved() -> dict:
    return to_dict(load_config({"buffer": {"batch_size": 4}, "train": {"total_frames": 6000}}))


def _requested(**sections) -> Config:
    return load_config({"resume": "/runs/a", **sections})


def test_allow_listed_overrides_are_applied():
    cfg = resume.merge(_saved(), _requested(train={"total_frames": 9000}, eval={"every": 7}),
                       {"train.total_frames", "eval.every"})
    assert cfg.train.total_frames == 9000 and cfg.eval.every == 7
    assert cfg.buffer.batch_size == 4  # from the saved config, not this invocation's default


def test_an_allow_listed_key_not_given_keeps_the_saved_runs_value():
    """``resume=DIR`` alone continues the run as configured: its logger (a W&B run stays
    a W&B run), evaluation and workers, not this invocation's defaults."""
    saved = to_dict(load_config({"logger": {"backend": "wandb", "project": "mine"}, "eval": {"every": 7},
                                 "collector": {"num_workers": 3}, "device": "cpu", "train": {"total_frames": 6000}}))
    requested = _requested(train={"total_frames": 9000})  # everything else at this invocation's defaults
    cfg = resume.merge(saved, requested, {"resume", "train.total_frames"})
    assert cfg.train.total_frames == 9000 and cfg.resume == "/runs/a"
    assert (cfg.logger.backend, cfg.logger.project, cfg.eval.every, cfg.collector.num_workers) == \
        ("wandb", "mine", 7, 3)


@pytest.mark.gpu_acceptance(CHECKPOINT_RESUME)
def test_a_requeued_run_may_land_on_other_hardware():
    """device, collector.num_workers, threads and cuda_fast_math follow the machine the
    resumed job runs on (a GPU run resumed on CPU, fewer cores), not the saved run's."""
    saved = to_dict(load_config({"device": "cuda", "collector": {"num_workers": 7}, "threads": 9}))
    overrides = {"device": "cpu", "threads": 1, "cuda_fast_math": False}
    requested = load_config({"resume": "/runs/a", "collector": {"num_workers": 1}, **overrides})
    given = {"device", "threads", "cuda_fast_math", "collector.num_workers"}
    resume.refuse_overrides(saved, requested, given)  # accepted
    cfg = resume.merge(saved, requested, given)
    assert (cfg.device, cfg.collector.num_workers, cfg.threads, cfg.cuda_fast_math) == ("cpu", 1, 1, False)


def test_a_refused_override_names_the_key_and_both_values():
    with pytest.raises(UserError) as err:
        resume.refuse_overrides(_saved(), _requested(buffer={"batch_size": 8}), {"buffer.batch_size"})
    message = str(err.value)
    assert "refused override: buffer.batch_size (saved 4, given 8)" in message
    assert ("Only train.total_frames, train.max_minutes, logger.*, eval.*, checkpoint.*, compile.cache_dir, "
            "compile.cache_artifact, compile.background_timeout_minutes, profiling.*, retain_host_memory, device, "
            "collector.num_workers, threads, "
            "cuda_fast_math may change on resume") in message


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
    foreign["algo"]["hidden_dim"] = 2 * run_config["algo"]["hidden_dim"]
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


# -- the allow-list as a table: every allowed leaf accepted and applied ------------------------

# A value no config would carry by default, for leaves whose strings are checked.
_VALID_STRINGS = {"device": "cpu", "resume": "/runs/b", "algo.name": "dreamer_v1"}


def _schema_leaves(cls=Config, prefix=""):
    """(dotted key, type) for every leaf of the schema (the algo section: the default algo's class)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        inner = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)]
        if dataclasses.is_dataclass(tp) or inner:
            yield from _schema_leaves(inner[0] if inner else tp, f"{prefix}{f.name}.")
        else:
            yield prefix + config_key(f.name), tp  # env.import, as the command line names it


def _another_value(key: str, tp, current):
    """A valid value for ``key`` that differs from ``current``, drawn from its schema type."""
    if key in _VALID_STRINGS:
        return _VALID_STRINGS[key]
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) is typing.Union:  # Optional[X]
        return _another_value(key, args[0], current)
    if typing.get_origin(tp) is typing.Literal:
        return next(a for a in args if a != current)
    if typing.get_origin(tp) is list:
        return [*(current or []), "resumed"]
    if typing.get_origin(tp) is dict:
        return {**(current or {}), "resumed": True}
    if tp is bool:
        return not current
    if tp is int:
        return (current or 0) + 1
    if tp is float:
        return (current or 0.0) * 2 + 1.0
    if tp is str:
        return f"{current or 'x'}_resumed"
    raise AssertionError(f"no value generator for {key}: {tp}")


def _deep_merge(a: dict, b: dict) -> dict:
    return {**a, **{k: _deep_merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
                    for k, v in b.items()}}


def _nest(key: str, value) -> dict:
    head, _, rest = key.partition(".")
    return {head: _nest(rest, value) if rest else value}


ALLOWED_LEAVES = [(k, tp) for k, tp in _schema_leaves() if resume.overridable(k)]
REFUSED_LEAVES = [(k, tp) for k, tp in _schema_leaves() if not resume.overridable(k)]


def test_the_table_covers_every_allow_listed_entry():
    # Each entry of RESUME_OVERRIDABLE names at least one leaf (a typo would name none).
    for entry in resume.RESUME_OVERRIDABLE:
        assert any(k == entry or k.startswith(entry + ".") for k, _ in ALLOWED_LEAVES), entry


@pytest.mark.parametrize("key, tp", ALLOWED_LEAVES, ids=[k for k, _ in ALLOWED_LEAVES])
def test_every_allow_listed_key_is_accepted_and_applied(key, tp):
    saved = _saved()
    value = _another_value(key, tp, resume.flatten(saved).get(key))
    requested = load_config(_deep_merge({"resume": "/runs/a"}, _nest(key, value)))
    assert resume.flatten(to_dict(requested))[key] == value != resume.flatten(saved).get(key)
    resume.refuse_overrides(saved, requested, {key})  # accepted
    merged = resume.flatten(to_dict(resume.merge(saved, requested, {key})))
    assert merged[key] == value  # applied: the resumed run carries the new value
    assert merged["buffer.batch_size"] == 4  # the rest stays the saved run's


@pytest.mark.parametrize("key, tp", REFUSED_LEAVES, ids=[k for k, _ in REFUSED_LEAVES])
def test_every_other_key_is_refused_naming_it(key, tp):
    saved = _saved()
    value = _another_value(key, tp, resume.flatten(saved).get(key))
    try:
        requested = load_config(_deep_merge({"resume": "/runs/a"}, _nest(key, value)))
    except UserError:  # the generated value breaks a cross-field rule: not an override anyone can give
        pytest.skip(f"{key}={value!r} is not a valid config alone")
    with pytest.raises(UserError, match=rf"refused override: {re.escape(key)} \(saved "):
        resume.refuse_overrides(saved, requested, {key})
    # And merge never carries it over (were the refusal skipped, the saved value would win).
    assert resume.flatten(to_dict(resume.merge(saved, requested, {key})))[key] == resume.flatten(saved)[key]


# -- group overrides (env=..., experiment=...) on resume: refused ----------------------------------


@pytest.fixture
def hydra_command_line():
    """compose(overrides) -> (composed config, overridden_keys of that command line), as
    the up-front checks (dreamer.check) and a launcher's job see them, without starting a run."""
    import hydra
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from dreamer.check import overridden_keys
    from dreamer.config import register_configs

    register_configs()
    GlobalHydra.instance().clear()

    def compose(overrides):
        dict_cfg = hydra.compose("config", overrides=overrides, return_hydra_config=True)
        HydraConfig.instance().set_config(dict_cfg)
        with open_dict(dict_cfg):  # the task function is handed the config without it
            del dict_cfg["hydra"]
        return dict_cfg, overridden_keys(overrides, dict_cfg)

    with hydra.initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        yield compose
    GlobalHydra.instance().clear()


def test_prof_variables_on_resume_count_as_given(hydra_command_line, monkeypatch):
    """PROF_ENABLED=1 ... resume=DIR profiles the resumed run: the environment's
    profiling keys are given like command-line ones (and only those)."""
    monkeypatch.setenv("PROF_ENABLED", "1")
    monkeypatch.setenv("PROF_ITERATIONS", "70-72")
    monkeypatch.delenv("PROF_OUTPUT_DIR", raising=False)
    monkeypatch.delenv("PROF_MODE", raising=False)
    _, keys = hydra_command_line(["resume=/runs/a"])
    assert {"profiling.enabled", "profiling.first_update", "profiling.last_update"} <= keys
    assert not {"profiling.output_dir", "profiling.mode", "eval.every"} & keys
    requested = load_config({"resume": "/runs/a"}, environ=os.environ)
    merged = resume.merge(_saved(), requested, keys)
    assert (merged.profiling.enabled, merged.profiling.first_update, merged.profiling.last_update) == (True, 70, 72)


def test_overridden_keys_names_what_a_group_option_changes(hydra_command_line):
    _, keys = hydra_command_line(["experiment=smoke", "seed=3"])
    assert {"experiment", "seed"} <= keys
    assert {"env.from_pixels", "buffer.batch_length"} <= keys  # set by the preset, not typed
    _, keys = hydra_command_line(["env=dmc"])
    assert {"env", "env.backend", "env.name"} <= keys


@pytest.mark.parametrize("override, refused", [("env=dmc", "env.backend"), ("experiment=smoke", "algo.actor_lr")])
def test_a_group_override_on_resume_is_refused(hydra_command_line, override, refused):
    saved = _saved()  # a Pendulum-on-states run with the default experiment
    dict_cfg, keys = hydra_command_line([override, "resume=/runs/a"])
    requested = load_config(dict_cfg)
    with pytest.raises(UserError, match=rf"refused override: .*{re.escape(refused)} \(saved "):
        resume.refuse_overrides(saved, requested, keys)


def test_a_checkpoint_written_after_the_resume_was_checked_is_refused(tmp_path):
    """The checks read the newest checkpoint before the run locked its directory; one written in
    between (another run there) means the checked state is stale: one line, nothing restored."""
    first = ckpt.save_checkpoint(tmp_path, {"tag": 1}, updates=1, keep=3)
    state = {"path": str(first), "unreadable": []}
    resume.refuse_checkpoints_written_since(tmp_path, state)  # nothing newer
    ckpt.save_checkpoint(tmp_path, {"tag": 2}, updates=2, keep=3)
    with pytest.raises(UserError, match=r"ckpt_0000000002.pt was written while this run started"):
        resume.refuse_checkpoints_written_since(tmp_path, state)

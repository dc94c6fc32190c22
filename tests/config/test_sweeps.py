"""conf/sweep/*.yaml: W&B sweep files whose runs are valid `python -m dreamer` invocations."""

from __future__ import annotations

import hydra
import pytest
import yaml
from hydra.core.global_hydra import GlobalHydra
from wandb.sdk.launch.sweeps.utils import create_sweep_command_args

from dreamer.config import load_config, register_configs
from tests.support.paths import CONF_DIR

SWEEPS = sorted((CONF_DIR / "sweep").glob("*.yaml"))


@pytest.fixture(scope="module")
def compose():
    register_configs()
    GlobalHydra.instance().clear()
    with hydra.initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        yield lambda overrides: hydra.compose("config", overrides=list(overrides))
    GlobalHydra.instance().clear()


def candidate_values(spec: dict) -> list:
    """Every value a sweep may pick for one parameter: its list, or the ends of its range."""
    if "values" in spec:
        return list(spec["values"])
    if "value" in spec:
        return [spec["value"]]
    return [spec["min"], spec["max"]]


def test_there_are_sweep_files():
    assert SWEEPS


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_sweep_command_runs_dreamer_with_hydra_overrides(path):
    sweep = yaml.safe_load(path.read_text())
    command = sweep["command"]
    assert command[command.index("-m") + 1] == "dreamer"
    assert command[-1] == "${args_no_hyphens}"
    metrics = ("eval_sample_return_mean", "eval_mode_return_mean", "updates_per_s", "frames_per_s")
    assert sweep["metric"]["name"] in metrics
    assert "logger=wandb" in command


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_every_swept_key_exists_and_every_value_is_valid(path, compose):
    sweep = yaml.safe_load(path.read_text())
    fixed = [arg for arg in sweep["command"] if "=" in arg and not arg.startswith("${")]
    for key, spec in sweep["parameters"].items():
        for value in candidate_values(spec):
            # The exact `key=value` text a W&B agent puts on the command line.
            args = create_sweep_command_args({"args": {key: {"value": value}}})["args_no_hyphens"]
            cfg = load_config(compose(fixed + args))
            section, _, leaf = key.rpartition(".")
            node = cfg
            for part in filter(None, section.split(".")):
                node = getattr(node, part)
            assert getattr(node, leaf) == value, f"{path.name}: {args} did not set {key}"

"""One story for defaults: the schema's dataclass defaults are the run
`python -m dreamer` makes, and each preset says which algorithm it trains."""

from __future__ import annotations

import pytest
import yaml
from omegaconf import OmegaConf

from dreamer.config import ALGO_CONFIGS, Config, load_config, to_dict, validate
from tests.support.paths import CONF_DIR
from tests.support.presets import EXPERIMENTS, preset_algorithms

PUBLISHED = yaml.safe_load((CONF_DIR.parent / "tests/config/dreamerv3_published.yaml").read_text())["presets"]


def test_the_default_run_is_the_schemas_defaults(compose):
    """`python -m dreamer` with no override composes to exactly ``Config()``:
    no YAML file adds to or changes what the dataclasses say."""
    composed = OmegaConf.to_container(compose(), resolve=True)
    composed.pop("hydra", None)
    assert composed == to_dict(validate(Config()))
    assert to_dict(load_config(compose())) == to_dict(validate(Config()))


def test_the_default_run_is_v3_on_pendulum_states_eager():
    cfg = Config()
    assert cfg.algo.name == "dreamer_v3" and cfg.experiment == "default"
    assert (cfg.env.backend, cfg.env.name, cfg.env.from_pixels) == ("gymnasium", "Pendulum-v1", False)
    assert cfg.compile.enabled is False


def test_compile_on_and_off_say_what_they_do(compose):
    assert load_config(compose(["compile=on"])).compile.enabled is True
    assert load_config(compose(["compile=off"])).compile.enabled is False


@pytest.mark.parametrize("preset, algo", sorted(preset_algorithms().items()))
def test_every_preset_names_the_algorithm_it_trains(compose, preset, algo):
    assert algo in ("dreamer_v1", "dreamer_v3"), (
        f"conf/experiment/{preset}.yaml: add `- override /algo: dreamer_v1|dreamer_v3` to its defaults list"
    )
    assert load_config(compose([f"experiment={preset}"])).algo.name == algo


def _leaves(data: dict, prefix: str = ""):
    for key, value in data.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


@pytest.mark.parametrize("preset", sorted(set(preset_algorithms()) - set(PUBLISHED)))
def test_a_preset_holds_only_what_differs_from_the_schema(preset):
    """A preset key equal to the schema's default is a second copy of it. (The
    published V3 presets keep the published values they record, equal or not.)"""
    body = yaml.safe_load((EXPERIMENTS / f"{preset}.yaml").read_text())
    body.pop("defaults", None)
    schema = to_dict(Config(algo=ALGO_CONFIGS[preset_algorithms()[preset]]()))
    copies = []
    for key, value in _leaves(body):
        node = schema
        for part in key.split("."):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        if node == value:
            copies.append(f"{key}={value!r}")
    assert not copies, f"conf/experiment/{preset}.yaml repeats the schema's defaults (drop them): {copies}"

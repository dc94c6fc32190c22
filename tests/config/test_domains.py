"""Every numeric config key has a domain on its schema field, and a value outside it is one
line naming the key and the allowed range (dreamer/config/domains.py, validate.py).

The table is built from the schema itself: a new numeric key without a domain fails here."""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest

from dreamer.config import ALGO_CONFIGS, Config, config_key, load_config
from dreamer.config.domains import domain_of, is_numeric
from dreamer.errors import UserError


def _sections() -> list[tuple[str, type, dict]]:
    """(key prefix, config class, the dict that selects it): every section, each algorithm's class."""
    found = [("", Config, {})]
    hints = typing.get_type_hints(Config)
    for spec in dataclasses.fields(Config):
        tp = hints[spec.name]
        if dataclasses.is_dataclass(tp):
            found.append((spec.name + ".", tp, {}))
    for name, cls in ALGO_CONFIGS.items():
        found.append(("algo.", cls, {"name": name}))
    return found


def _numeric_keys() -> list[tuple[str, type, str, type, dict]]:
    """(dotted key, class, field name, field type, selector) for every numeric field of every class."""
    keys = []
    for prefix, cls, selector in _sections():
        hints = typing.get_type_hints(cls)
        for spec in dataclasses.fields(cls):
            if is_numeric(hints[spec.name]):
                keys.append((prefix + config_key(spec.name), cls, spec.name, hints[spec.name], selector))
    return keys


def _is_int(tp) -> bool:
    return tp is int or int in typing.get_args(tp)


def _outside(domain, as_int: bool) -> list:
    """Values just outside ``domain`` on each bounded side, and non-finite ones for floats."""
    values = []
    if domain.low is not None:
        values += [domain.low - 1] + ([domain.low] if domain.low_open else [])
    if domain.high is not None:
        values += [domain.high + 1] + ([domain.high] if domain.high_open else [])
    if as_int:
        return [int(v) for v in values]
    return [float(v) for v in values] + [math.nan, math.inf]


def _config_with(key: str, value, selector: dict) -> dict:
    *sections, leaf = key.split(".")
    data: dict = {}
    node = data
    for section in sections:
        node = node.setdefault(section, dict(selector) if section == "algo" else {})
    node[leaf] = value
    return data


NUMERIC_KEYS = _numeric_keys()
CASES = [
    pytest.param(key, value, selector, id=f"{selector.get('name', '')}:{key}={value}".lstrip(":"))
    for key, cls, name, tp, selector in NUMERIC_KEYS
    if domain_of(cls, name) is not None
    for value in _outside(domain_of(cls, name), _is_int(tp))
]


def test_the_table_covers_both_algorithms_and_every_section():
    keys = {key for key, *_ in NUMERIC_KEYS}
    assert {"seed", "threads", "algo.gamma", "algo.lmbda", "algo.state_dim", "algo.num_bins",
            "env.sticky_action_prob", "buffer.capacity", "train.max_minutes", "profiling.last_update"} <= keys
    assert len(CASES) > 2 * len(NUMERIC_KEYS)  # each key tried on at least two values


@pytest.mark.parametrize("key, cls, name", [(k, c, n) for k, c, n, _, _ in NUMERIC_KEYS],
                         ids=[f"{c.__name__}.{n}" for _, c, n, _, _ in NUMERIC_KEYS])
def test_every_numeric_key_declares_its_domain(key, cls, name):
    assert domain_of(cls, name) is not None, (
        f"{key} ({cls.__name__}.{name}) has no domain: declare it on the schema field, e.g. "
        f"`{name}: int = within(DEFAULT, POSITIVE)` (dreamer/config/domains.py)")


@pytest.mark.parametrize("key, value, selector", CASES)
def test_a_value_outside_a_keys_domain_is_one_line_naming_the_key_and_its_range(key, value, selector):
    cls = next(c for k, c, *_, s in NUMERIC_KEYS if k == key and s == selector)
    domain = domain_of(cls, key.rpartition(".")[2])
    with pytest.raises(UserError) as err:
        load_config(_config_with(key, value, selector))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{key}={value} ") and domain.describe() in message, message


@pytest.mark.parametrize("data, message", [
    # the inputs of issue 45 item 11 that ended in a traceback or were accepted silently
    ({"algo": {"name": "dreamer_v3", "gamma": 1.0}}, "algo.gamma=1.0 must be in (0, 1)"),
    ({"algo": {"name": "dreamer_v3", "gamma": 1.5}}, "algo.gamma=1.5 must be in (0, 1)"),
    ({"algo": {"name": "dreamer_v1", "gamma": 1.01}}, "algo.gamma=1.01 must be in (0, 1]"),
    ({"algo": {"name": "dreamer_v3", "lmbda": 1.2}}, "algo.lmbda=1.2 must be in [0.0, 1.0]"),
    ({"algo": {"name": "dreamer_v1", "lmbda": -0.1}}, "algo.lmbda=-0.1 must be in [0.0, 1.0]"),
    ({"seed": -1}, "seed=-1 must be in [0, 2147483647]"),
    ({"env": {"sticky_action_prob": 1.5}}, "env.sticky_action_prob=1.5 must be in [0.0, 1.0]"),
    ({"env": {"sticky_action_prob": -0.25}}, "env.sticky_action_prob=-0.25 must be in [0.0, 1.0]"),
    ({"threads": 0}, "threads=0 must be > 0 (or null for automatic)"),
    ({"train": {"max_minutes": 0}}, "train.max_minutes=0 must be > 0 (or null for no limit)"),
])
def test_the_reported_inputs_are_refused_in_one_line(data, message):
    with pytest.raises(UserError) as err:
        load_config(data)
    assert str(err.value) == message


@pytest.mark.parametrize("data", [
    {"algo": {"name": "dreamer_v1", "gamma": 1.0}},  # V1's lambda-returns take an undiscounted horizon
    {"algo": {"name": "dreamer_v3", "lmbda": 0.0}},
    {"algo": {"name": "dreamer_v3", "lmbda": 1.0}},
    {"env": {"sticky_action_prob": 0.0}},
    {"env": {"sticky_action_prob": 1.0}},
    {"seed": 2**31 - 1},
    {"collector": {"num_workers": 0, "init_random_frames": 0}},
])
def test_the_closed_ends_of_a_domain_are_accepted(data):
    load_config(data)


def test_the_defaults_of_both_algorithms_lie_in_their_domains():
    for name in ALGO_CONFIGS:
        load_config({"algo": {"name": name}})


# -- learning must be able to start (issue 45 item 1) ------------------------------------


def test_a_replay_too_small_for_the_first_update_is_one_line_naming_the_keys_and_the_value():
    """experiment=smoke buffer.capacity=50 collected forever: the replay never held the
    100 random steps (init_random_frames) learning waited for."""
    smoke = {"collector": {"init_random_frames": 100}, "buffer": {"capacity": 50, "batch_size": 4, "batch_length": 10},
             "env": {"max_episode_steps": 50}, "train": {"total_frames": 600}}
    with pytest.raises(UserError) as err:
        load_config(smoke)
    assert str(err.value) == (
        "buffer.capacity=50 cannot hold what the first update needs, max(buffer.batch_size x buffer.batch_length = "
        "40, collector.init_random_frames = 100) = 100 agent steps: set buffer.capacity>=100 "
        "(or lower collector.init_random_frames)")
    smoke["buffer"]["capacity"] = 100
    load_config(smoke)  # exactly enough


def test_a_replay_smaller_than_one_batch_of_sequences_names_the_batch():
    with pytest.raises(UserError, match=r"buffer.capacity=30 cannot hold .* = 40 agent steps: set buffer.capacity>=40 "
                                        r"\(or lower buffer.batch_size x buffer.batch_length\)"):
        load_config({"collector": {"init_random_frames": 0}, "buffer": {"capacity": 30, "batch_size": 4,
                                                                        "batch_length": 10}})


def test_a_run_shorter_than_its_prefill_is_one_line_naming_the_frames_it_needs():
    """train.total_frames below the prefill still collected, compiled and updated."""
    short = {"collector": {"init_random_frames": 100}, "buffer": {"batch_size": 4, "batch_length": 10},
             "env": {"action_repeat": 2, "max_episode_steps": 50}, "train": {"total_frames": 199}}
    with pytest.raises(UserError) as err:
        load_config(short)
    assert str(err.value).startswith("train.total_frames=199 ends before learning starts") and (
        "= 200 env frames (env.action_repeat=2); set train.total_frames>=200 (or lower collector.init_random_frames)"
        in str(err.value))
    short["train"]["total_frames"] = 200
    load_config(short)


def test_a_resume_is_not_held_to_the_prefill_of_the_presets_it_does_not_name():
    """`resume=D train.total_frames=400` composes the defaults (a 2000-step prefill) around the two keys
    given; the run continues with its saved config, so only that one counts."""
    load_config({"resume": "/runs/a", "train": {"total_frames": 400}})

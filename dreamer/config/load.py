"""Composed config (a Hydra DictConfig or a plain dict) <-> the dataclasses.

:func:`load_config` builds the classes of :mod:`dreamer.config.schema` from the
composed config, checking each value's type and each key's name on the way
(one line per mistake, naming the dotted key), then validates the whole
(:func:`dreamer.config.validate.validate`). :func:`to_dict` is its inverse
(config.json, checkpoints, W&B).
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from typing import Any, Literal, Optional, Union, get_args, get_origin

from dreamer.config.environ import profiling_from_env
from dreamer.config.schema import Config
from dreamer.config.validate import check_size_preset, validate
from dreamer.errors import UserError

# Python field -> its name in YAML, on the command line and in config.json, for
# keys a Python keyword names (a dataclass field cannot be called `import`).
KEYWORD_KEYS = {"import_": "import"}


def config_key(field_name: str) -> str:
    return KEYWORD_KEYS.get(field_name, field_name)


def _keys(cls: type) -> set[str]:
    """A config class's keys, named as in YAML."""
    return {config_key(f.name) for f in dataclasses.fields(cls)}


_SCALARS = {int: (int,), float: (int, float), bool: (bool,), str: (str,)}


# Choices renamed since: key -> {old value: new value} (refused in one line naming the new one).
RENAMED_VALUES = {"compile.update": {"card": "losses"}}


def _check_value(path: str, tp: Any, value: Any) -> None:
    origin = get_origin(tp)
    if origin is Union:
        if value is None:
            return
        tp = next(a for a in get_args(tp) if a is not type(None))
        origin = get_origin(tp)
    if tp in _SCALARS:
        ok = isinstance(value, _SCALARS[tp]) and not (tp is not bool and isinstance(value, bool))
        if not ok:
            raise UserError(f"{path}={value!r} must be a {tp.__name__}")
        return
    if origin is list:
        if not isinstance(value, list):
            raise UserError(f"{path}={value!r} must be a list, e.g. {path}=[a,b]")
        for index, item in enumerate(value):
            _check_value(f"{path}[{index}]", get_args(tp)[0], item)
        return
    if origin is Literal:
        allowed = get_args(tp)
        renamed = RENAMED_VALUES.get(path, {}).get(value)
        if renamed is not None:
            raise UserError(f"{path}={value} was renamed: use {path}={renamed}")
        if value not in allowed:
            shown = ", ".join("null" if a is None else str(a) for a in allowed)
            raise UserError(f"{path}={value!r} is not allowed; choose one of: {shown}")


def _variants(tp: Any) -> Optional[dict[str, type]]:
    """For a Union of config classes told apart by their ``name`` (Config.algo):
    name -> class; None for any other type."""
    args = get_args(tp) if get_origin(tp) is Union else ()
    if not args or not all(dataclasses.is_dataclass(a) for a in args):
        return None
    return {a.__dataclass_fields__["name"].default: a for a in args}


def _pick_variant(variants: dict[str, type], data: dict, default: str, prefix: str) -> type:
    """The class ``data``'s name picks; keys only another variant has are one line naming the fix."""
    name = data.get("name", default)
    if name not in variants:
        raise UserError(f"{prefix}name={name!r} is not allowed; choose one of: {', '.join(variants)}")
    cls, group = variants[name], prefix.rstrip(".")
    own = _keys(cls)
    for other_name, other in variants.items():
        only_other = _keys(other) - own
        foreign = sorted(only_other & set(data))
        if not foreign:
            continue
        if only_other <= set(data):
            # Every key of the other algorithm: its group option with only the name changed.
            raise UserError(
                f"{prefix}name={name} only renames {group}={other_name} (its keys stay): "
                f"choose the algorithm with {group}={name} instead"
            )
        raise UserError(
            f"{prefix}{foreign[0]} is a {other_name} key, but {prefix}name={name}: "
            f"add {group}={other_name} or drop it"
        )
    return cls


def _build(cls: type, data: dict, prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    field_of = {config_key(f.name): f.name for f in dataclasses.fields(cls)}  # YAML key -> field
    unknown = sorted(set(data) - set(field_of))
    if unknown:
        raise UserError(
            f"unknown config key {prefix}{unknown[0]}; known keys here: {', '.join(sorted(field_of))}"
        )
    defaults = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key in field_of.keys() & set(data):
        name, value = field_of[key], data[key]
        tp, path = hints[name], prefix + key
        variants = _variants(tp)
        if variants is not None:
            value = value or {}
            default = defaults[name].default_factory().name
            kwargs[name] = _build(_pick_variant(variants, value, default, path + "."), value, path + ".")
        elif dataclasses.is_dataclass(tp):
            kwargs[name] = _build(tp, value or {}, path + ".")
        else:
            _check_value(path, tp, value)
            kwargs[name] = value
    return cls(**kwargs)


def load_config(dict_cfg: Any, environ: Optional[typing.Mapping[str, str]] = None) -> Config:
    """Composed Hydra/OmegaConf config (or a plain dict) -> validated Config.

    ``environ`` (the process environment, passed by the entry point) may set
    the profiling keys through PROF_* variables; they win over the YAML.
    """
    from omegaconf import DictConfig, OmegaConf

    if isinstance(dict_cfg, DictConfig):
        dict_cfg = OmegaConf.to_container(dict_cfg, resolve=True)
    dict_cfg = {k: v for k, v in dict_cfg.items() if k != "hydra"}
    from_env = profiling_from_env(environ or {})
    if from_env:
        dict_cfg["profiling"] = {**(dict_cfg.get("profiling") or {}), **from_env}
    # Before the algo section is built: a size preset's V3 keys on V1 are one mistake, model=.
    algo = dict_cfg.get("algo")
    default = Config.__dataclass_fields__["algo"].default_factory().name
    algo_name = algo.get("name", default) if isinstance(algo, dict) else default
    check_size_preset(dict_cfg.get("model"), algo_name)
    return validate(_build(Config, dict_cfg, ""))


def to_dict(cfg: Any) -> dict:
    """A config as a plain dict keyed as in YAML (``env.import``), what
    :func:`load_config` reads back (config.json, checkpoints, W&B)."""
    out = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        out[config_key(f.name)] = to_dict(value) if dataclasses.is_dataclass(value) else copy.deepcopy(value)
    return out

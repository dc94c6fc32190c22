"""The schema in Hydra's ConfigStore: the base of conf/config.yaml, the group
options that are plain dataclass defaults, and our requeueing launcher.

OmegaConf does not understand ``Literal[...]`` annotations, so what is
registered is a mirror of each class with every ``Literal`` replaced by ``str``
(:func:`omegaconf_schema`); the choices are checked by
:func:`dreamer.config.load_config` instead, with better messages than
OmegaConf would give.

Group options that would only repeat defaults (``algo=dreamer_v1``,
``algo=dreamer_v3``, ``collector=default``, ``buffer=default``,
``compile=off``, ``logger=csv``) are these mirrors, so the dataclasses
stay the one place a default is written; conf/ holds only what differs.
"""

from __future__ import annotations

import dataclasses
import keyword
import typing
from dataclasses import field
from typing import Any, Literal, Optional, Union, get_args, get_origin

from dreamer.config.load import config_key
from dreamer.config.schema import (
    ALGO_CONFIGS,
    BufferConfig,
    CollectorConfig,
    CompileConfig,
    Config,
    LoggerConfig,
)

# group -> {option: class whose defaults that option is}
GROUP_DEFAULTS: dict[str, dict[str, type]] = {
    "collector": {"default": CollectorConfig},
    "buffer": {"default": BufferConfig},
    "compile": {"off": CompileConfig},  # the schema's compile section is eager
    "logger": {"csv": LoggerConfig},
}


def _is_variant_union(tp: Any) -> bool:
    """A Union of several config classes (Config.algo): its class is picked by name."""
    args = [a for a in get_args(tp) if a is not type(None)] if get_origin(tp) is Union else []
    return len(args) > 1 and all(dataclasses.is_dataclass(a) for a in args)


def _strip_literals(tp: Any) -> Any:
    """The OmegaConf-compatible twin of a type: Literal[...] -> str."""
    if get_origin(tp) is Literal:
        return str
    if _is_variant_union(tp):
        return Any
    if get_origin(tp) is Union:
        return Optional[_strip_literals(next(a for a in get_args(tp) if a is not type(None)))]
    if dataclasses.is_dataclass(tp):
        return omegaconf_schema(tp)
    return tp


_SCHEMAS: dict[type, type] = {}


def _schema_dataclass(name: str, fields: list[tuple[str, Any, Any]]) -> type:
    """``make_dataclass``, also for keys that are Python keywords (``import``).

    make_dataclass refuses a keyword because the ``__init__``, ``__repr__`` and
    ``__eq__`` it generates would not parse. OmegaConf only reads a schema's
    fields and defaults and never builds one, so such a schema goes without them.
    """
    if not any(keyword.iskeyword(key) for key, _, _ in fields):
        return dataclasses.make_dataclass(name, fields)
    namespace: dict[str, Any] = {"__annotations__": {key: tp for key, tp, _ in fields}}
    namespace.update({key: default for key, _, default in fields})
    return dataclasses.dataclass(init=False, repr=False, eq=False)(type(name, (), namespace))


def omegaconf_schema(cls: type) -> type:
    """A dataclass mirroring ``cls`` that OmegaConf accepts (for the ConfigStore),
    its fields named as in YAML (:data:`~dreamer.config.load.KEYWORD_KEYS`)."""
    from omegaconf import MISSING

    if cls in _SCHEMAS:
        return _SCHEMAS[cls]
    hints = typing.get_type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        default = (
            field(default=f.default)
            if f.default is not dataclasses.MISSING
            else field(default_factory=f.default_factory)
        )
        if _is_variant_union(hints[f.name]):
            # Set by its config group (algo=dreamer_v3 in conf/config.yaml's defaults).
            default = field(default=MISSING)
        elif dataclasses.is_dataclass(hints[f.name]):
            # The schema class itself, not an instance: OmegaConf reads its defaults.
            default = field(default_factory=lambda nested=omegaconf_schema(hints[f.name]): nested)
        fields.append((config_key(f.name), _strip_literals(hints[f.name]), default))
    schema = _schema_dataclass(cls.__name__ + "Schema", fields)
    _SCHEMAS[cls] = schema
    return schema


def register_configs() -> None:
    """Register the schema so conf/config.yaml can use it as its base, the
    group options that are dataclass defaults, and our requeueing launcher as
    ``hydra/launcher=submitit_local``."""
    from hydra.core.config_store import ConfigStore
    from hydra.core.plugins import Plugins
    from omegaconf import OmegaConf

    from hydra_plugins.hydra_submitit_launcher.config import LocalQueueConf

    cs = ConfigStore.instance()
    cs.store(name="dreamer_schema", node=omegaconf_schema(Config))
    for name, cls in ALGO_CONFIGS.items():
        # Typed (a value of the wrong type fails while composing) but open
        # (struct off): a key of the other algorithm, e.g. from a size preset
        # or an experiment, reaches load_config, which names it and the fix in
        # one line instead of Hydra's generic block.
        node = OmegaConf.structured(omegaconf_schema(cls), flags={"struct": False})
        cs.store(group="algo", name=name, node=node)
    for group, options in GROUP_DEFAULTS.items():
        for name, cls in options.items():
            cs.store(group=group, name=name, node=omegaconf_schema(cls))
    # submitit_local runs the very requeue path the SLURM launcher
    # (conf/hydra/launcher/slurm.yaml) runs on a cluster. Hydra's plugin scan
    # re-runs the plugin's own registration, so scan first, then replace it. (A
    # YAML file of that name would trip Hydra's deprecated schema matching.)
    Plugins.instance()
    cs.store(
        group="hydra/launcher", name="submitit_local", provider="dreamer",
        node=LocalQueueConf(_target_="hydra_plugins.dreamer_launcher.requeue.RequeueingLocalLauncher"),
    )

"""Typed, validated configuration: the one source of truth for a run.

Import from here (``from dreamer.config import Config, load_config``). The
modules beside this file, one concern each:

- ``schema``: the dataclasses, the one place every default is written;
- ``validate``: value and cross-field checks on a built Config;
- ``load``: composed config <-> dataclasses (``load_config``, ``to_dict``);
- ``hydra_store``: the schema and default group options in Hydra's ConfigStore;
- ``environ``: PROF_* environment variables -> profiling keys;
- ``compose``: the command line's overrides composed as Hydra will, before it runs.
"""

from dreamer.config.environ import profiling_from_env
from dreamer.config.hydra_store import omegaconf_schema, register_configs
from dreamer.config.load import KEYWORD_KEYS, config_key, load_config, to_dict
from dreamer.config.schema import (
    ALGO_CONFIGS,
    AlgoConfig,
    BufferConfig,
    CheckpointConfig,
    CollectorConfig,
    CompileConfig,
    Config,
    DistributedConfig,
    DreamerV1Config,
    DreamerV3Config,
    EnvConfig,
    EvalConfig,
    LoggerConfig,
    ProfilingConfig,
    TrainConfig,
)
from dreamer.config.validate import get_path, validate

__all__ = [
    "ALGO_CONFIGS", "AlgoConfig", "BufferConfig", "CheckpointConfig", "CollectorConfig",
    "CompileConfig", "Config", "DistributedConfig", "DreamerV1Config", "DreamerV3Config",
    "EnvConfig", "EvalConfig", "KEYWORD_KEYS", "LoggerConfig", "ProfilingConfig", "TrainConfig",
    "config_key", "get_path", "load_config", "omegaconf_schema", "profiling_from_env",
    "register_configs", "to_dict", "validate",
]

"""Typed, validated configuration: the one source of truth for a run.

Import from here (``from dreamer.config import Config, load_config``); the
modules beside this file hold the schema, its validation and its Hydra
registration.
"""

from dreamer.config.schema import *  # noqa: F401,F403
from dreamer.config.schema import (  # noqa: F401  (private helpers some tests and scripts use)
    KEYWORD_KEYS,
    _build,
    config_key,
    get_path,
    omegaconf_schema,
    profiling_from_env,
)

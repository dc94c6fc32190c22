"""Fixtures for the config tests."""

from __future__ import annotations

import hydra
import pytest
from hydra.core.global_hydra import GlobalHydra

from dreamer.config import register_configs
from tests.support.paths import CONF_DIR


@pytest.fixture(scope="module")
def compose():
    """``compose(overrides)``: the raw Hydra config ``python -m dreamer OVERRIDES`` composes."""
    register_configs()
    GlobalHydra.instance().clear()
    with hydra.initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        yield lambda overrides=(): hydra.compose("config", overrides=list(overrides))
    GlobalHydra.instance().clear()

"""Where the Hydra YAML lives: the checkout's top-level ``conf/`` (the one place
configs are edited), or, in an installed wheel, the copy it ships under
``<prefix>/share/dreamer/conf`` (pyproject.toml's data-files)."""

from __future__ import annotations

import sys
from pathlib import Path

CHECKOUT_CONF = Path(__file__).resolve().parents[2] / "conf"
INSTALLED_CONF = Path(sys.prefix) / "share" / "dreamer" / "conf"


def conf_dir() -> Path:
    """The config directory this installation uses."""
    if (CHECKOUT_CONF / "config.yaml").is_file():
        return CHECKOUT_CONF
    return INSTALLED_CONF

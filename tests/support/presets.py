"""The presets (conf/experiment/) and the algorithm each one trains, read from
its own defaults list (``override /algo: NAME``): the one place a preset's
algorithm is written, which the docs' preset tables cite."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.support.paths import CONF_DIR

EXPERIMENTS = CONF_DIR / "experiment"


def preset_names() -> list[str]:
    return sorted(p.stem for p in EXPERIMENTS.glob("*.yaml"))


def declared_algorithm(path: Path) -> str | None:
    """The ``override /algo: NAME`` of a preset's defaults list; None without one."""
    for entry in (yaml.safe_load(path.read_text()) or {}).get("defaults") or []:
        if isinstance(entry, dict) and "override /algo" in entry:
            return entry["override /algo"]
    return None


def preset_algorithms() -> dict[str, str | None]:
    """preset name -> the algo group option it selects (dreamer_v1 / dreamer_v3)."""
    return {name: declared_algorithm(EXPERIMENTS / f"{name}.yaml") for name in preset_names()}

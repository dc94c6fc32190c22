"""A script or benchmark file imported as a module, so its functions can be tested."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def load_script(path: Path):
    """``path`` (a .py file under scripts/ or benchmarks/) imported as a module; its folder goes on
    ``sys.path`` for the import only, as ``python path`` would have it (benchmarks import their shared
    helper module by name)."""
    name = f"script_{path.parent.name}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module

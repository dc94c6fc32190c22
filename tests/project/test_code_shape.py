"""Small functions: none in dreamer/ over 80 lines (a builder that grows past it
splits into named stages, as dreamer/run/build.py and the algos' models.py do); and
floors: each of dreamer/'s packages imports only from itself and the floors below it."""

from __future__ import annotations

import ast

from tests.support.paths import REPO_ROOT

MAX_FUNCTION_LINES = 80
PACKAGE = REPO_ROOT / "dreamer"


def _function_lengths():
    """(where, lines) for every function and method, decorators and docstring included."""
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                where = f"{path.relative_to(REPO_ROOT)}:{node.lineno} {node.name}"
                yield where, node.end_lineno - first + 1


def test_no_function_in_the_package_is_over_80_lines():
    long = [f"{where} ({lines} lines)" for where, lines in _function_lengths() if lines > MAX_FUNCTION_LINES]
    assert not long, f"split into named stages (at most {MAX_FUNCTION_LINES} lines each): " + "; ".join(long)


def test_the_measure_sees_the_package():
    lengths = dict(_function_lengths())
    assert any(where.endswith(" build_run") for where in lengths)  # the walk reached dreamer/run/build.py


# dreamer/'s packages (and top-level modules), lowest floor first. Code imports from its own
# package and lower floors only (lazy imports inside functions count too): config/ knows
# nothing of runs, replay or envs; the checks that need them sit on the floor that owns them
# (run/preflight) and the command line above all of them (check, __main__).
FLOORS = (("errors",), ("config",), ("envs", "system"), ("data", "report"), ("algos",), ("run",),
          ("check",), ("__main__", "__init__"))
FLOOR = {name: level for level, names in enumerate(FLOORS) for name in names}


def _package_of(path) -> str:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else path.stem


def _imported_packages(path) -> set[str]:
    """The dreamer packages (or top-level modules) ``path`` imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] if node.module != "dreamer" else [f"dreamer.{a.name}" for a in node.names]
        found |= {name.split(".")[1] for name in names if name.startswith("dreamer.")}
    return found


def test_no_import_runs_back_up_the_floors():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        package = _package_of(path)
        assert package in FLOOR, f"{path.relative_to(REPO_ROOT)}: give dreamer/{package} a floor in FLOORS"
        upward += [f"{path.relative_to(REPO_ROOT)} imports dreamer.{other}" for other in _imported_packages(path)
                   if other != package and FLOOR[other] >= FLOOR[package]]
    assert not upward, "imports that run up (or across) the floors: " + "; ".join(upward)


def test_the_floors_see_every_import():
    """The measure finds the imports it judges: config's own, and run's of every floor below."""
    assert _imported_packages(PACKAGE / "config" / "load.py") == {"config", "errors"}
    assert {"algos", "config", "data", "envs", "errors", "report", "system"} <= set().union(
        *(_imported_packages(p) for p in (PACKAGE / "run").glob("*.py")))

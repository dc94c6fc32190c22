"""Small functions: none in dreamer/ over 80 lines (a builder that grows past it
splits into named stages, as dreamer/run/build.py and the algos' models.py do)."""

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

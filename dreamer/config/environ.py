"""PROF_* environment variables -> profiling.* keys, read once at the edge."""

from __future__ import annotations

import typing

from dreamer.errors import UserError

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def profiling_from_env(environ: typing.Mapping[str, str]) -> dict:
    """The profiling.* keys set by PROF_* environment variables (the profiling
    workflow's interface); read here, once, so nothing deeper reads the environment."""
    out: dict = {}
    if "PROF_ENABLED" in environ:
        flag = environ["PROF_ENABLED"].strip().lower()
        if flag not in _TRUE + _FALSE:
            raise UserError(f"PROF_ENABLED={environ['PROF_ENABLED']!r} must be 1 or 0")
        out["enabled"] = flag in _TRUE
    if "PROF_ITERATIONS" in environ:
        text = environ["PROF_ITERATIONS"]
        first, sep, last = text.partition("-")
        if not (first.strip().isdigit() and (not sep or last.strip().isdigit())):
            raise UserError(f"PROF_ITERATIONS={text!r} must be FIRST-LAST learner updates, e.g. 50-55")
        out["first_update"] = int(first)
        out["last_update"] = int(last) if sep else int(first)
    if "PROF_OUTPUT_DIR" in environ:
        out["output_dir"] = environ["PROF_OUTPUT_DIR"]
    if "PROF_MODE" in environ:
        out["mode"] = environ["PROF_MODE"].strip().lower()
    return out

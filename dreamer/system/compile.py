"""Compile policy: what gets torch.compile'd, and with which arguments.

The RSSM world model stays eager (its per-step stack fights CUDA graphs and
dynamo gains little on a Python loop); the actor and value losses are
compiled. Compilation is per process: each process that runs a compiled
module compiles and warms it itself.
"""

from __future__ import annotations

from typing import Callable

import torch

from dreamer.config import CompileConfig


def compile_kwargs(cc: CompileConfig) -> dict:
    """torch.compile arguments; config validation guarantees mode xor options."""
    kwargs: dict = {"backend": cc.backend, "fullgraph": False}
    if cc.mode is not None:
        kwargs["mode"] = cc.mode
    elif cc.options and cc.backend == "inductor":
        # Only inductor takes inductor options; other backends reject them.
        kwargs["options"] = {**cc.options, "triton.cudagraphs": cc.cudagraphs}
    return kwargs


def maybe_compile(fn: Callable, cc: CompileConfig) -> Callable:
    if not cc.enabled:
        return fn
    return torch.compile(fn, **compile_kwargs(cc))

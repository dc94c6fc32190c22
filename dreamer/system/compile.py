"""Compile policy: what gets torch.compile'd, and with which arguments.

The actor and value losses are compiled. The RSSM world model's loop over
time stays eager (its per-step stack fights CUDA graphs and dynamo gains
little on a Python loop); V3 compiles the step it calls (``compile.rssm_step``),
never with CUDA graphs. Compilation is per process: each process that runs a
compiled module compiles and warms it itself.
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


def rssm_step_compile_kwargs(cc: CompileConfig) -> dict:
    """torch.compile arguments for one RSSM step: the losses' own, without CUDA
    graphs (the rollout stacks every step's outputs, which graph replay would
    overwrite on the next step)."""
    kwargs = compile_kwargs(cc)
    mode = kwargs.pop("mode", None)
    if mode == "max-autotune":
        kwargs["mode"] = "max-autotune-no-cudagraphs"
    elif mode in ("default", "max-autotune-no-cudagraphs"):
        kwargs["mode"] = mode
    elif cc.backend == "inductor":  # no mode, or reduce-overhead (whose only point is CUDA graphs)
        kwargs["options"] = {**(cc.options or {}), "triton.cudagraphs": False}
    return kwargs

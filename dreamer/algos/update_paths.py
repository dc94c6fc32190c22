"""Which update a learner runs (``compile.update``), and the pieces of the whole-update paths.

- ``card``: the learner's update body (``BaseLearner._update_body``) runs
  eagerly, its actor and value losses compiled by ``BaseLearner.compile`` (and
  V3's RSSM step): the world model eager, as the design card draws it.
- ``whole``: the same body as ONE ``torch.compile(fullgraph=True)`` graph:
  world-model, actor, critic and replay-value losses, both backward passes
  (dynamo traces ``Tensor.backward`` under ``trace_autograd_ops``), the gradient
  all-reduce of data-parallel runs, gradient norms, the optimiser steps with
  their non-finite skip, the slow critic and the metrics (:func:`compile_whole_update`).
- ``captured`` (CUDA only): that body (compiled when ``compile.enabled``, eager
  otherwise) replayed from a CUDA graph (:class:`torchrl_ext.CapturedStep`): no
  host sync, no allocation and no input copy per update; the replay buffer
  copies each sample straight into the graph's static inputs.

Until the compiled or captured update is ready the learner runs the card's body
with eager losses: while a background compile fills the caches
(``compile.background``), the first updates are eager as on the card path; a
captured update's warm-up calls (run before its capture, on a side stream) are
real updates, so the capture delays no update either.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch

from dreamer.config import CompileConfig
from dreamer.errors import UserError
from dreamer.system.compile import rssm_step_compile_kwargs

UPDATE_PATHS = ("card", "whole", "captured")


def resolve_update_path(compile_cfg: CompileConfig, device: torch.device) -> str:
    """compile.update as it runs on ``device``: auto is the card's path (the measured
    default so far), captured needs CUDA."""
    choice = compile_cfg.update
    if choice == "auto":
        return "card"
    if choice == "captured" and device.type != "cuda":
        raise UserError(
            f"compile.update=captured replays the update from CUDA graphs, and the learner runs on {device}: "
            "use compile.update=whole (one compiled graph, no CUDA graph) or card, or run on a GPU (device=cuda)"
        )
    return choice


def describe_update_path(path: str, compile_cfg: CompileConfig) -> str:
    """The start log's words for ``path``."""
    if path == "card":
        if not compile_cfg.enabled:
            return "card (eager)"
        return "card (world model eager, actor/value losses compiled)"
    compiled = "compiled" if compile_cfg.enabled else "eager"
    if path == "whole":
        return "whole (the whole update as one compiled graph)"
    return f"captured (the whole update, {compiled}, replayed from a CUDA graph; eager until captured)"


def whole_update_compile_kwargs(compile_cfg: CompileConfig) -> dict:
    """torch.compile arguments for the whole update: one graph, never inductor's own CUDA
    graphs (the captured path captures the whole update itself)."""
    return {**rssm_step_compile_kwargs(compile_cfg), "fullgraph": True}


def compile_whole_update(body: Callable, compile_cfg: CompileConfig) -> Callable:
    """``body`` (one whole update, backward passes and optimiser steps included) as one graph.

    Dynamo traces ``Tensor.backward`` only with ``trace_autograd_ops`` set, at
    trace time: each call runs under it (a recompile traces under it too)."""
    compiled = torch.compile(body, **whole_update_compile_kwargs(compile_cfg))

    def whole_update(*args, **kwargs):
        with torch._dynamo.config.patch(trace_autograd_ops=True):
            return compiled(*args, **kwargs)

    whole_update.compiled = compiled
    return whole_update


def tensor_leaves(tree) -> list[torch.Tensor]:
    """Every tensor in nested dicts, lists and tuples (a ``state_dict``'s)."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        tree = list(tree.values())
    if isinstance(tree, (list, tuple)):
        return [t for item in tree for t in tensor_leaves(item)]
    return []


@contextlib.contextmanager
def restored_after(tensors: list[torch.Tensor]) -> Iterator[None]:
    """Run the block, then put every tensor in ``tensors`` back as it was, in place
    (the same tensors: a compiled or captured update keeps reading them)."""
    saved = [(t, t.detach().clone()) for t in {id(t): t for t in tensors}.values()]
    try:
        yield
    finally:
        with torch.no_grad():
            for tensor, value in saved:
                tensor.copy_(value)

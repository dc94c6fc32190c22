"""How a learner's update runs (``compile.update``): one strategy object per path.

The learner (dreamer/algos/learner.py) holds the losses, optimisers and the
update body (``BaseLearner._update_body``: device work only, the same on every
path); a path decides how that body runs:

- :attr:`UpdatePath.LOSSES` ("losses"): the body runs eagerly and calls its actor
  and value losses (and V3's RSSM step) through ``torch.compile``: the world
  model eager, the shape the design card draws (:class:`CompiledLosses`).
- :attr:`UpdatePath.WHOLE` ("whole"): the body as ONE ``torch.compile(fullgraph=True)``
  graph: world-model, actor, critic and replay-value losses, the backward passes
  (dynamo traces ``Tensor.backward`` under ``trace_autograd_ops``), the gradient
  all-reduce of data-parallel runs, gradient norms, the optimiser steps with their
  non-finite skip, the slow critic and the metrics (:class:`WholeGraph`).
- :attr:`UpdatePath.CAPTURED` ("captured", CUDA only): the body (compiled when
  ``compile.enabled``, eager otherwise) replayed from a CUDA graph
  (:class:`torchrl_ext.CapturedStep`): no host sync, no allocation and no input
  copy per update; the replay buffer copies each sample straight into the graph's
  static inputs (:class:`Captured`).

``compile.update=auto`` picks by measurement (docs/PERFORMANCE.md): on CUDA the
captured update with the eager body (the compiled body has not yet run on a GPU
with the pinned torch); on the CPU the compiled losses (the whole update's cold
compile did not finish at size1m, and at CPU scale its first compiled update
comes minutes later than the compiled losses').

Until a path's compiled code is ready the body runs with eager losses: while a
background compile fills the caches (``compile.background``) the first updates
are eager; a captured update's warm-up calls (before its capture, on a side
stream) are real updates, so the capture delays no update either.
"""

from __future__ import annotations

import abc
import contextlib
import enum
from typing import TYPE_CHECKING, Callable, Iterator

import torch
from tensordict import TensorDictBase

from dreamer.config import CompileConfig
from dreamer.errors import UserError
from dreamer.system.compile import maybe_compile, rssm_step_compile_kwargs
from dreamer.system.timing import device_clock
from torchrl_ext import CapturedStep

if TYPE_CHECKING:
    from dreamer.algos.learner import BaseLearner


class UpdatePath(enum.Enum):
    LOSSES = "losses"
    WHOLE = "whole"
    CAPTURED = "captured"


def resolve_update_path(compile_cfg: CompileConfig, device: torch.device) -> UpdatePath:
    """compile.update as it runs on ``device`` (auto: see the module docstring)."""
    choice = compile_cfg.update
    if choice == "auto":
        return UpdatePath.CAPTURED if device.type == "cuda" else UpdatePath.LOSSES
    path = UpdatePath(choice)
    if path is UpdatePath.CAPTURED and device.type != "cuda":
        raise UserError(
            f"compile.update=captured replays the update from CUDA graphs, and the learner runs on {device}: "
            "use compile.update=whole (one compiled graph, no CUDA graph) or losses, or run on a GPU (device=cuda)"
        )
    return path


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


class UpdateStrategy(abc.ABC):
    """How one learner's update body runs. ``__call__`` makes one update; before
    ``compile()`` it runs the body with eager losses."""

    path: UpdatePath

    def __init__(self, learner: BaseLearner, compile_cfg: CompileConfig, device: torch.device):
        self.learner = learner
        self.compile_cfg = compile_cfg
        self.device = device
        self.run: Callable[[TensorDictBase], None] = learner._update_body

    def __call__(self, batch: TensorDictBase) -> None:
        self.run(batch)

    @abc.abstractmethod
    def compile(self) -> None:
        """Make this path's compiled (or captured) update the one that runs."""

    @abc.abstractmethod
    def warmup(self, batch: TensorDictBase) -> float:
        """Compile and exercise what ``compile()`` set up on a real batch before the first
        update, leaving the run's state and RNG streams as they were; returns seconds."""

    @abc.abstractmethod
    def describe(self) -> str:
        """The start log's words for this path."""

    def input_buffer(self) -> TensorDictBase | None:
        """The static inputs a captured update reads (None on the other paths)."""
        return None

    def state_loaded(self) -> None:
        """The learner loaded a checkpoint: new tensors where the old ones were."""

    def _rng_devices(self) -> list[int]:
        return [self.device.index or 0] if self.device.type == "cuda" else []


class CompiledLosses(UpdateStrategy):
    """The body eager, its compilable losses compiled (``BaseLearner.compile_losses``)."""

    path = UpdatePath.LOSSES

    def compile(self) -> None:
        self.learner.compile_losses(maybe_compile)

    def describe(self) -> str:
        if not self.compile_cfg.enabled:
            return "losses (eager)"
        return "losses (world model eager, actor/value losses compiled)"

    def warmup(self, batch: TensorDictBase) -> float:
        """Forward and backward of every loss, as the update runs them, ``warmup_iters``
        times; no optimiser step; the global RNG streams and running statistics are left
        as they were (a resumed run continues its own)."""
        if not self.compile_cfg.enabled:
            return 0.0
        learner = self.learner
        start = device_clock(self.device)
        with torch.random.fork_rng(devices=self._rng_devices()), learner.held_statistics():
            prepared = learner.prepare(batch.clone())
            for _ in range(self.compile_cfg.warmup_iters):
                learner.forward_and_backward(prepared)
        learner.drop_grads()
        return device_clock(self.device) - start


class WholeGraph(UpdateStrategy):
    """The whole body as one compiled graph (``compile.enabled``), gradients in place."""

    path = UpdatePath.WHOLE

    def compile(self) -> None:
        """Optimiser state and gradient buffers are created first: a step that created
        them would trace twice, or allocate inside a capture (gradients are zeroed in
        place from here on)."""
        self.learner.prepare_state_in_place()
        body = self.learner._update_body
        self.compiled = None
        if self.compile_cfg.enabled:
            body = self.compiled = compile_whole_update(self.learner._update_body, self.compile_cfg)
        self.run = self._wrap(body)

    def _wrap(self, body: Callable) -> Callable:
        return body

    def describe(self) -> str:
        return "whole (the whole update as one compiled graph)"

    def warmup(self, batch: TensorDictBase) -> float:
        """compile.warmup_iters (at least one) compiled updates, after which every tensor
        they changed (weights, optimiser state, statistics, metrics) and the RNG streams are
        put back as they were."""
        if self.compiled is None:
            return 0.0
        start = device_clock(self.device)
        with torch.random.fork_rng(devices=self._rng_devices()), restored_after(self.learner.state_tensors()):
            for _ in range(max(1, self.compile_cfg.warmup_iters)):
                self.compiled(batch.clone())
        return device_clock(self.device) - start


class Captured(WholeGraph):
    """That body (compiled or eager) replayed from a CUDA graph; the capture key is
    the input layout and the learner's (batch size, batch length) split."""

    path = UpdatePath.CAPTURED

    def _wrap(self, body: Callable) -> Callable:
        self.learner.set_capturable(True)
        learner = self.learner
        return CapturedStep(body, warmup=max(1, self.compile_cfg.warmup_iters), device=self.device,
                            key=lambda: (learner.batch_size, learner.batch_length))

    def describe(self) -> str:
        body = "compiled" if self.compile_cfg.enabled else "eager"
        return f"captured (the whole update, {body}, replayed from a CUDA graph; eager until captured)"

    def input_buffer(self) -> TensorDictBase | None:
        if isinstance(self.run, CapturedStep) and self.run.ready:
            return self.run.static_inputs
        return None

    def state_loaded(self) -> None:
        self.learner.set_capturable(True)
        if isinstance(self.run, CapturedStep):
            self.run.invalidate()  # the graph would go on reading the replaced tensors


STRATEGIES: dict[UpdatePath, type[UpdateStrategy]] = {
    UpdatePath.LOSSES: CompiledLosses, UpdatePath.WHOLE: WholeGraph, UpdatePath.CAPTURED: Captured,
}


def make_update_path(learner: BaseLearner, compile_cfg: CompileConfig, device: torch.device) -> UpdateStrategy:
    """The strategy compile.update names on ``device``, for ``learner``; refused in one line
    where the algorithm's whole update cannot be one graph and the path would compile it."""
    path = resolve_update_path(compile_cfg, device)
    why_not = learner.NO_COMPILED_WHOLE_UPDATE
    if path is not UpdatePath.LOSSES and compile_cfg.enabled and why_not:
        if compile_cfg.update == "auto":
            # auto on CUDA: this algorithm's eager update is what can be captured.
            return STRATEGIES[path](learner, _eager_body(compile_cfg), device)
        raise UserError(
            f"compile.update={path.value} compiles the whole update, and {learner.algo_cfg.name}'s cannot be "
            f"one graph ({why_not}): use compile.update=losses"
            + (", or compile=off to capture the eager update" if path is UpdatePath.CAPTURED else "")
        )
    if compile_cfg.update == "auto" and path is UpdatePath.CAPTURED:
        compile_cfg = _eager_body(compile_cfg)  # until the compiled captured body has run on a GPU
    return STRATEGIES[path](learner, compile_cfg, device)


def _eager_body(compile_cfg: CompileConfig) -> CompileConfig:
    import dataclasses

    return dataclasses.replace(compile_cfg, enabled=False)

"""A training step replayed from one CUDA graph: no host sync, copy or allocation per call.

tensordict's :class:`~tensordict.nn.CudaGraphModule` captures a callable after a
few warm-up calls, but every replay first synchronises the device with the host
(``torch.cuda.synchronize``), copies its inputs into the static buffers and
clones the outputs: a host wait and fresh allocations in every update. A
training step that keeps its state in place (weights, optimiser moments,
running metrics) needs none of them. :class:`CapturedStep`:

- warms the step up for real (``warmup`` calls on a side stream, as
  ``torch.cuda.graph`` requires: lazy initialisation, library workspaces, a
  ``torch.compile``'d step's own warm-up), then captures one call into a graph
  and replays it for that call: every call is one real step;
- reads its inputs from ``static_inputs``, a copy of the tensordict the capture
  saw. A producer that fills ``static_inputs`` in place (a replay buffer's
  device copy) hands over that very tensordict and nothing is copied; another
  tensordict of the same layout (keys, shapes, dtypes, devices) is copied in,
  one non-blocking copy per entry;
- captures again, after a new warm-up, for inputs of another layout or another
  ``key()`` (what else the step's graph depends on, e.g. how it reshapes its
  inputs), and after :meth:`invalidate` (call it when the step's state tensors were
  replaced, e.g. an optimiser loading a checkpoint: the graph would go on reading
  the old ones).

The step's return value (tensors the graph writes) is returned from each call and
holds that call's values until the next call.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable

import torch
from tensordict import TensorDictBase


def input_layout(inputs: TensorDictBase) -> tuple:
    """What a captured graph depends on in its inputs: batch size, keys, shapes, dtypes, devices."""
    leaves = tuple((key, t.shape, t.dtype, t.device) for key, t in inputs.items(True, True))
    return (inputs.batch_size, leaves)


class CapturedStep:
    """``step(inputs)`` replayed from a CUDA graph (see the module docstring).

    Args:
        step: the training step, a callable of one tensordict; it must keep its
            state in tensors it updates in place and run no host-dependent
            control flow (what a graph replays is the capture's kernels).
        warmup: real calls before each capture, on a side stream.
        device: the CUDA device (default: the current one).
        key: what else the graph depends on besides the input layout, asked at each
            call (a change captures again); None: the layout alone.
    """

    def __init__(self, step: Callable[[TensorDictBase], Any], *, warmup: int = 2,
                 device: torch.device | str | None = None, key: Callable[[], Hashable] | None = None):
        if warmup < 1:
            raise ValueError(f"warmup must be >= 1 (torch.cuda.graph needs warmed-up work), got {warmup}")
        self.step = step
        self.key = key or (lambda: None)
        self.warmup = warmup
        self.device = torch.device(device) if device is not None else None
        self.captures = 0  # graphs captured so far
        self.static_inputs: TensorDictBase | None = None
        self._graph = None
        self._out = None
        self._layout = None
        self._warm_calls = 0
        self._side_stream = None

    @property
    def ready(self) -> bool:
        """A graph is captured: the next call with ``static_inputs`` replays it."""
        return self._graph is not None

    def invalidate(self) -> None:
        """Forget the graph: the next calls warm up and capture again."""
        self._graph = self._out = self._layout = self.static_inputs = None
        self._warm_calls = 0

    def _layout_of(self, inputs: TensorDictBase) -> tuple:
        return input_layout(inputs), self.key()

    def __call__(self, inputs: TensorDictBase):
        if self._graph is not None and self.key() != self._layout[1]:
            self.invalidate()
        if self._graph is not None and inputs is not self.static_inputs:
            if self._layout_of(inputs) == self._layout:
                self.static_inputs.update_(inputs, non_blocking=True)
            else:
                self.invalidate()
        if self._graph is not None:
            self._graph.replay()
            return self._out
        if self._warm_calls < self.warmup:
            self._warm_calls += 1
            return self._on_side_stream(inputs)
        return self._capture(inputs)

    def _on_side_stream(self, inputs: TensorDictBase):
        if self._side_stream is None:
            self._side_stream = torch.cuda.Stream(self.device)
        current = torch.cuda.current_stream(self.device)
        self._side_stream.wait_stream(current)
        with torch.cuda.stream(self._side_stream):
            out = self.step(inputs)
        current.wait_stream(self._side_stream)
        return out

    def _capture(self, inputs: TensorDictBase):
        static = inputs.clone()  # allocated outside the graph's pool: the producer's to fill
        graph = torch.cuda.CUDAGraph()
        # thread_local: other threads (replay prefetch, weight pushes) keep using CUDA meanwhile.
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            out = self.step(static)
        self._graph, self._out, self.static_inputs = graph, out, static
        self._layout = self._layout_of(static)
        self.captures += 1
        graph.replay()  # capturing ran nothing: this call's step
        return out

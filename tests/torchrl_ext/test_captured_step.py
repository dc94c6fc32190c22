"""torchrl_ext/capture.py CapturedStep, its control flow on the CPU with torch.cuda's
graph API stood in for (the real capture: tests/algos/test_captured_update.py, CUDA):
warm-up calls run for real on a side stream, one capture, then replays reading the
static inputs, which a producer fills in place (no copy) or which are copied into;
another input layout, or invalidate(), warms up and captures again."""

from __future__ import annotations

import contextlib

import pytest
import torch
from tensordict import TensorDict

from torchrl_ext import CapturedStep


class FakeGraphs:
    """torch.cuda's streams and graphs on the CPU: a capture records the captured
    call instead of running it, a replay runs the recorded call again on the
    tensors the capture saw (what replaying its kernels does)."""

    def __init__(self, monkeypatch):
        self.log: list[str] = []
        self.capturing = None  # the graph being captured
        self.stream = "default"
        outer = self

        class Stream:
            def __init__(self, device=None):
                self.name = "side"

            def wait_stream(self, other):
                outer.log.append(f"{self.name} waits")

        class Graph:
            def __init__(self):
                self.calls = []

            def replay(self):
                outer.log.append("replay")
                for fn in self.calls:
                    fn()

        class DefaultStream(Stream):
            def __init__(self):
                self.name = "default"

        @contextlib.contextmanager
        def use_stream(stream):
            before, self.stream = self.stream, stream.name
            try:
                yield
            finally:
                self.stream = before

        @contextlib.contextmanager
        def graph(g, capture_error_mode="global", **kwargs):
            assert capture_error_mode == "thread_local"
            self.capturing = g
            try:
                yield
            finally:
                self.capturing = None

        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: DefaultStream())
        monkeypatch.setattr(torch.cuda, "stream", use_stream)
        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "graph", graph)


@pytest.fixture
def graphs(monkeypatch):
    return FakeGraphs(monkeypatch)


def counting_step(graphs: FakeGraphs, total: torch.Tensor):
    """A step that adds its input into ``total`` (its state, updated in place)."""

    def run(inputs):
        graphs.log.append(f"step on {graphs.stream}")
        total.add_(inputs["x"].sum())

    def step(inputs):
        if graphs.capturing is not None:
            graphs.log.append("captured")
            graphs.capturing.calls.append(lambda: run(inputs))
            return None
        run(inputs)

    return step


def batch(value: float, size: int = 3) -> TensorDict:
    return TensorDict({"x": torch.full((size,), value)}, [size])


def test_warm_up_calls_run_for_real_then_one_capture_then_replays_of_the_static_inputs(graphs, monkeypatch):
    total = torch.zeros(())
    captured = CapturedStep(counting_step(graphs, total), warmup=2)
    for value in (1.0, 2.0):
        captured(batch(value))
    assert graphs.log == ["side waits", "step on side", "default waits"] * 2
    assert total.item() == 9.0 and not captured.ready
    graphs.log.clear()
    captured(batch(3.0))  # captured, and replayed for this call
    assert graphs.log == ["captured", "replay", "step on default"]
    assert total.item() == 18.0 and captured.ready and captured.captures == 1

    static = captured.static_inputs
    copies = []
    monkeypatch.setattr(TensorDict, "update_", lambda td, *a, **k: copies.append(1))
    static["x"].fill_(4.0)  # a producer filling the static inputs in place
    captured(static)
    assert copies == [] and total.item() == 30.0
    monkeypatch.undo()
    captured(batch(5.0))  # any other tensordict of the layout is copied in
    assert torch.equal(static["x"], torch.full((3,), 5.0)) and total.item() == 45.0
    assert captured.captures == 1


def test_another_input_layout_or_invalidate_warms_up_and_captures_again(graphs):
    total = torch.zeros(())
    captured = CapturedStep(counting_step(graphs, total), warmup=1)
    captured(batch(1.0))
    captured(batch(1.0))
    assert captured.captures == 1
    first_static = captured.static_inputs
    graphs.log.clear()
    captured(batch(1.0, size=4))  # a new batch shape: warm-up on the side stream, no replay of the old graph
    assert "replay" not in graphs.log and not captured.ready
    captured(batch(1.0, size=4))
    assert captured.captures == 2 and captured.static_inputs.shape == (4,)
    assert captured.static_inputs is not first_static

    captured.invalidate()  # e.g. the optimiser's state was replaced by a checkpoint
    assert not captured.ready and captured.static_inputs is None
    graphs.log.clear()
    captured(batch(1.0, size=4))
    captured(batch(1.0, size=4))
    assert graphs.log.count("captured") == 1 and captured.captures == 3
    assert total.item() == 2 * 3 + 4 * 4  # every call was exactly one step


def test_a_capture_needs_a_warm_up():
    with pytest.raises(ValueError, match="warmup"):
        CapturedStep(lambda inputs: None, warmup=0)


def test_a_changed_key_captures_again_even_for_the_same_input_layout(graphs):
    """What else the step's graph depends on (a learner's (B, T) split of the same flat batch):
    a new key warms up and captures again instead of replaying the old graph."""
    total = torch.zeros(())
    split = [(2, 5)]
    captured = CapturedStep(counting_step(graphs, total), warmup=1, key=lambda: split[0])
    for _ in range(3):
        captured(batch(1.0, size=10))
    assert captured.captures == 1
    split[0] = (1, 10)  # the same 10 records, another split
    graphs.log.clear()
    captured(batch(1.0, size=10))
    assert "replay" not in graphs.log and not captured.ready
    captured(batch(1.0, size=10))
    assert captured.captures == 2 and total.item() == 5 * 10

"""What a captured update replays: the body's kernels with the Python numbers the capture saw.

A CUDA graph records each kernel with the scalar arguments it was launched with. A number the
update body computes on the host and passes to torch (a learning rate warmed up from a host
step count, a schedule, a counter) would be frozen at its capture-time value in every replay.
Here the body runs twice, as a capture and a replay would, and every Python number it hands
to torch is recorded: none may differ between the two calls. No GPU needed."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from dreamer.algos.registry import ALGORITHMS
from dreamer.config import validate
from tests.support.configs import tiny_config
from tests.support.learners import learner_on

pytestmark = pytest.mark.usefixtures("single_thread")

CPU = torch.device("cpu")


def _numbers(value) -> list:
    """The Python numbers in a call's arguments (nested lists, tuples and dicts included)."""
    if isinstance(value, bool) or isinstance(value, (int, float)):
        return [value]
    if isinstance(value, (list, tuple)):
        return [n for item in value for n in _numbers(item)]
    if isinstance(value, dict):
        return [n for item in value.values() for n in _numbers(item)]
    return []


class PythonNumbers(TorchFunctionMode):
    """Every torch call of the block, with the Python numbers it was given."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, list]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.calls.append((getattr(func, "__name__", repr(func)), _numbers(args) + _numbers(kwargs)))
        return func(*args, **kwargs)


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_two_updates_hand_torch_the_same_python_numbers(algo):
    cfg = tiny_config(algo=algo)
    if algo == "dreamer_v3":
        a = cfg.algo
        a.num_categoricals, a.num_classes, a.num_bins, a.mlp_layers = 4, 4, 31, 1
        a.lr_warmup_steps = 10  # still warming up at the updates below: the warm-up must live on the device
    else:
        cfg.algo.slow_value_tau = 0.02
    learner, batch = learner_on(validate(cfg), CPU)
    learner.prepare_state_in_place()  # as the captured path holds its state (gradients zeroed in place)
    learner.update(batch.clone())  # the warm-up call before a capture
    seen = []
    for _ in range(2):  # the captured call and a replay
        with PythonNumbers() as record:
            learner.path(batch.clone())
        seen.append(record.calls)
    assert len(seen[0]) == len(seen[1]) > 100
    differ = [(i, a, b) for i, (a, b) in enumerate(zip(*seen)) if a != b]
    assert not differ, f"Python numbers that change between updates (frozen by a capture): {differ[:5]}"

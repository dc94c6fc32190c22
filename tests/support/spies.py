"""Counting spies on tensor methods (host transfers) and torch's compile-cache counters."""

from __future__ import annotations

import traceback
from collections import Counter

import torch

# Tensor methods that copy a value to the host: on CUDA each one is a device sync.
HOST_TRANSFERS = ("item", "cpu", "tolist", "__float__", "__int__", "__bool__", "numpy")


def aot_cache_bypasses() -> int:
    """How many compiled graphs AOTAutograd's cache bypassed since ``counters.clear()``.

    torch's counter names are internals: a renamed counter would read 0 and pass a
    ``== 0`` check silently. So the cache must have recorded some outcome under the
    names read here, or the test says which names to update.
    """
    from torch._dynamo.utils import counters

    aot = counters["aot_autograd"]
    outcomes = {name for name in aot if name.startswith("autograd_cache_")}
    assert outcomes, (f"torch {torch.__version__} recorded no AOTAutograd cache outcome as autograd_cache_* "
                      f"(counters: {dict(aot)}): the counter names changed, update this helper")
    return aot["autograd_cache_bypass"]


class CallCounter:
    """Counts calls of patched methods and remembers where they came from."""

    def __init__(self):
        self.counts: Counter = Counter()
        self.sites: Counter = Counter()

    def total(self, *names: str) -> int:
        if not names:
            return sum(self.counts.values())
        return sum(self.counts[n] for n in names)

    def record(self, name: str) -> None:
        self.counts[name] += 1
        frame = traceback.extract_stack(limit=4)[-3]
        where = frame.filename.split("site-packages/")[-1]
        self.sites[f"{name} at {where}:{frame.lineno} ({frame.name})"] += 1

    def report(self) -> str:
        return "; ".join(f"{site} x{n}" for site, n in self.sites.most_common())


def spy_tensor_methods(monkeypatch, names, counter: CallCounter, ignore=lambda t: False):
    """Wrap ``torch.Tensor.<name>`` for each name with a counting wrapper.

    ``ignore(tensor)`` -> True skips counting for that tensor (the call still runs).
    """
    for name in names:
        original = getattr(torch.Tensor, name)

        def wrapper(self, *args, __name=name, __original=original, **kwargs):
            if not ignore(self):
                counter.record(__name)
            return __original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, wrapper)

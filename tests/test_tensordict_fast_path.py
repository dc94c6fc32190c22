"""tensordict's from_any fast path: module outputs are written without a package search."""

import importlib.util

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule

import dreamer  # noqa: F401  (installs the fast path, as every dreamer process does)
from torchrl_ext.tensordict_fast_path import install_from_any_fast_path


def test_module_outputs_are_written_without_searching_for_packages(monkeypatch):
    searched = []
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: searched.append(name) or real_find_spec(name, *a))
    module = TensorDictModule(torch.nn.Linear(3, 2), in_keys=["x"], out_keys=["y"])
    out = module(TensorDict(x=torch.ones(4, 3), batch_size=[4]))
    assert out["y"].shape == (4, 2)
    assert searched == []  # was: one find_spec("pandas") per output tensor


def test_from_any_results_are_unchanged():
    install_from_any_fast_path()  # idempotent: a second install wraps nothing twice
    assert getattr(TensorDictBase.__dict__["from_any"].__func__, "_returns_tensors_first")
    tensor = torch.arange(3)
    assert TensorDict.from_any(tensor) is tensor
    parameter = torch.nn.Parameter(torch.ones(2))
    assert TensorDict.from_any(parameter) is parameter
    converted = TensorDict.from_any({"a": tensor, "b": {"c": torch.zeros(3)}}, auto_batch_size=True)
    assert isinstance(converted, TensorDict) and converted.batch_size == (3,)
    assert (converted["a"] == tensor).all() and converted["b", "c"].shape == (3,)
    assert TensorDict.from_any(converted) is converted

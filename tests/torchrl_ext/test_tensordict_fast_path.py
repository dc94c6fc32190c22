"""tensordict's from_any fast path: module outputs are written without a package search."""

import importlib.util
import subprocess
import sys

import pytest
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule

from torchrl_ext.tensordict_fast_path import install_from_any_fast_path


def test_module_outputs_are_written_without_searching_for_packages(monkeypatch):
    install_from_any_fast_path()
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


PATCHED = "from tensordict import TensorDictBase; print(hasattr(TensorDictBase.__dict__['from_any'].__func__, " \
          "'_returns_tensors_first'))"


def _patched_after_each(*steps: str) -> list[bool]:
    """Whether from_any is patched after each of ``steps``, run in order in one fresh interpreter."""
    code = "\n".join(f"{step}\n{PATCHED}" for step in steps)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return [line == "True" for line in out.stdout.strip().splitlines()[-len(steps):]]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_importing_dreamer_patches_nothing_and_the_training_processes_are_patched():
    """User code, tests and scripts that import dreamer get tensordict as shipped; the learner's process
    (the Hydra task, dreamer.__main__.main) and every collector worker (its first call) get the fast path."""
    assert _patched_after_each(
        "import dreamer, dreamer.run.trainer, dreamer.data.collectors",
        "from dreamer.data.collectors import _start_worker; _start_worker(None)",
    ) == [False, True]
    source = (importlib.util.find_spec("dreamer.__main__").origin)
    main_body = open(source).read().split("def main(", 1)[1].split("\ndef ", 1)[0]
    assert "install_from_any_fast_path()" in main_body

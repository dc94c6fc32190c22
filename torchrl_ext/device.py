"""Moving a TorchRL module to a device, everything it holds included.

``nn.Module.to`` moves parameters and buffers. TorchRL modules also keep
tensors as plain attributes: a ``ProbabilisticTensorDictModule``'s
``distribution_kwargs`` (e.g. TanhNormal bounds) and the TensorSpecs of
exploration modules and actors (``_spec``). Left behind on a GPU, they make a
CPU worker that receives the module open a CUDA context of its own and copy
device-to-host at every step.
"""

from __future__ import annotations

import torch
from torch import nn
from torchrl.data import TensorSpec


def _moved(value, device: torch.device):
    if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
        return value.to(device)
    if isinstance(value, TensorSpec):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _moved(v, device) for k, v in value.items()}
    return value


def module_to(module: nn.Module, device: torch.device | str) -> nn.Module:
    """``module.to(device)``, plus the plain tensor attributes (also inside dicts) and
    TensorSpecs of every submodule; returns ``module``."""
    device = torch.device(device)
    module.to(device)
    for sub in module.modules():
        for name, value in list(vars(sub).items()):
            if name in ("_parameters", "_buffers", "_modules"):
                continue
            moved = _moved(value, device)
            if moved is not value:
                vars(sub)[name] = moved
    return module

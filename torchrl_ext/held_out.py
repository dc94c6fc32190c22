"""Modules that compute with another module's current weights and never differentiate them.

A Dreamer actor loss runs the world model (imagination) and the critic (bootstraps) with
their weights held out of the actor's graph: gradients reach the actor through their
inputs, never their weights. Upstream's losses hold them out per call with
``torchrl.objectives.utils.hold_out_net``, which under ``torch.compile`` swaps every
weight for a detached copy and back through tensordict calls
(``TensorDict.from_module(...).data.to_module(...)``), which dynamo traces slowly: a large
part of tracing a compiled Dreamer update.

:func:`held_out_view` holds a module out once, when the loss is built: the view's
parameters and buffers are detached tensors over the original's memory. It computes
what the original computes with its current weights (an optimiser step or
``load_state_dict`` writes them in place and the view reads the same memory), and
``hold_out_net`` on it does nothing, its parameters requiring no gradient.
"""

from __future__ import annotations

import copy
import itertools
import weakref

import torch
from torch import nn

# Where a view keeps (a weak reference to) the module it holds out.
_ORIGINAL = "_held_out_from"


def _weights(module: nn.Module) -> list[torch.Tensor]:
    return list(itertools.chain(module.parameters(), module.buffers()))


def held_out_view(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose parameters and buffers are detached tensors sharing
    the original's memory (nothing is copied but the module objects)."""
    detached = {id(t): t.detach() for t in _weights(module)}
    view = copy.deepcopy(module, memo=detached)
    view.__dict__[_ORIGINAL] = weakref.ref(module)  # not an attribute nn.Module registers
    return view


def shares_weights(view: nn.Module, module: nn.Module) -> bool:
    """Whether ``view`` still reads ``module``'s weights: each tensor over the same memory
    (a move to another device or dtype gives the original new memory and breaks that)."""
    ours, theirs = _weights(view), _weights(module)
    return len(ours) == len(theirs) and all(
        (a.data_ptr(), a.shape, a.stride(), a.dtype, a.device) == (b.data_ptr(), b.shape, b.stride(), b.dtype, b.device)
        for a, b in zip(ours, theirs)
    )


def stale_held_out_views(*roots: nn.Module) -> list[str]:
    """The held-out views in ``roots`` (and their submodules) that no longer read their
    original's weights, by name: each would imagine with weights the optimiser no
    longer updates."""
    stale = []
    for root in roots:
        for name, sub in root.named_modules():
            original = sub.__dict__.get(_ORIGINAL)
            if original is not None and (original() is None or not shares_weights(sub, original())):
                stale.append(f"{type(root).__name__}.{name}" if name else type(root).__name__)
    return stale

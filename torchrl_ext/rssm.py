"""RSSM pieces that keep upstream's numbers and cost less.

``eager_rollout_step``: for the duration, every ``RSSMRolloutV3`` inside a
module runs its eager step, even where ``compile_rollout("step")`` compiled it.
A compiled step is specialised to the batch shape and grad mode it was warmed
on; a caller at another shape (an open-loop report on a few sequences, under
``no_grad``) would otherwise compile a new graph in the middle of training.

``SelectiveRSSMRollout``: TorchRL's ``RSSMRollout`` unbinds its whole input over
time and stacks every key of every step back together, so a world-model
batch's observations (800 float 64x64 frames for Dreamer V1's 16x50 batch:
39 MB) are copied once per forward for nothing: the rollout neither reads nor
changes them. This subclass rolls out over its ``in_keys`` alone and writes the
results into the input tensordict; every other key is left as it was.

``CacheableRSSMPrior``: TorchRL's ``RSSMPrior`` runs its GRU inside
``torch.amp.autocast(enabled=False)`` on every call. Under ``torch.compile`` that
region becomes an ``_enter_autocast`` node, and AOTAutograd never caches a graph
holding one ("Unsupported call_function target _enter_autocast"): a warm start
re-traced and re-partitioned the whole compiled imagination (~11 s on the
default experiment). When autocast is off this subclass leaves the region out
and keeps the rest of it (the GRU in float32, its output back in the input's
dtype); under autocast it is upstream's forward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from tensordict import TensorDictBase
from torch import nn
from torchrl.modules import RSSMPrior, RSSMRolloutV3
from torchrl.modules.models.model_based import RSSMRollout


@contextlib.contextmanager
def eager_rollout_step(module: nn.Module) -> Iterator[None]:
    # RSSMRolloutV3._loop calls ``_step_fn or _step``; upstream has no public way
    # back to the eager step that keeps the compiled one (compile_rollout makes a
    # new torch.compile wrapper, which dynamo would trace again).
    rollouts = [m for m in module.modules() if isinstance(m, RSSMRolloutV3)]
    saved = [r._step_fn for r in rollouts]
    for r in rollouts:
        r._step_fn = None
    try:
        yield
    finally:
        for r, step_fn in zip(rollouts, saved):
            r._step_fn = step_fn


class SelectiveRSSMRollout(RSSMRollout):
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        rolled = super().forward(tensordict.select(*self.in_keys, strict=False))
        return tensordict.update(rolled)


class CacheableRSSMPrior(RSSMPrior):
    def forward(self, state, belief, action, noise=None):
        if torch.is_autocast_enabled(state.device.type):
            return super().forward(state, belief, action, noise)
        action_state = self.action_state_projector(torch.cat([state, action], dim=-1))
        belief = self.rnn(action_state.float(), belief.float() if belief is not None else None)
        belief = belief.to(action_state.dtype)
        prior_mean, prior_std = self.rnn_to_prior_projector(belief)
        if noise is None:
            noise = torch.randn_like(prior_std)
        return prior_mean, prior_std, prior_mean + noise * prior_std, belief

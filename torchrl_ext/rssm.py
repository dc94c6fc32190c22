"""RSSM pieces that keep upstream's numbers and cost less.

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

import torch
from tensordict import TensorDictBase
from torchrl.modules import RSSMPrior
from torchrl.modules.models.model_based import RSSMRollout


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

"""The acting policy every Dreamer model set builds the same way.

What the collector and evaluator run on real observations, one step at a time:
[initial belief at an episode's first step] -> encoder -> posterior -> actor
-> [exploration] -> prior (next belief) -> [actor action to env action]. It
carries the belief to the next step.

At an episode's first step the belief is the RSSM's initial one: the prior's
step from zero state, belief and action, which is what the world model's
training rollout computes where a replayed sequence reaches an ``is_first``
record (its RSSM zeroes state, belief and action there, then steps the prior).
Acting and training so read the first observation of an episode from the same
belief, as in DreamerV3's reference, where both run one ``observe`` function.

Key layout (N = envs; S = latent state, H = belief):
  obs                  (N, ...) as the env emits it (uint8 pixels | float vector)
  step_count           (N, 1)   0 at an episode's first step (the env's StepCounter)
  belief               (N, H)   in: the previous step's ("next", "belief"), zeros at reset
  state                (N, S)   out: the posterior sample
  action               (N, A)   out
  ("next", "belief")   (N, H)   out
"""

from __future__ import annotations

from typing import ClassVar, Protocol

import torch
from tensordict.nn import TensorDictModule, TensorDictModuleBase, TensorDictSequential
from torch import nn
from torchrl.modules.models.model_based import RSSMPriorV3

from dreamer.envs.keys import PIXELS_KEY


class ModelSet(Protocol):
    """What the run reads of an algorithm's networks (its ``build_models``' result)."""

    modules: nn.ModuleDict  # every trainable weight, by role (optimisers, checkpoints, rank sync)
    obs_key: str  # where the observation lives in a step's tensordict
    discrete: bool  # one-hot actions
    world_model: TensorDictModuleBase  # encoder -> RSSM rollout -> heads, on (B, T) batches

    def policy(self, explore: bool) -> TensorDictSequential:
        """Acting on real observations (collectors, evaluation)."""


class InitialBeliefAtEpisodeStart(nn.Module):
    """(belief, step_count) -> belief: where ``step_count`` is 0, the prior's belief after one
    step from zero state, belief and action; elsewhere the carried belief."""

    def __init__(self, prior: nn.Module, state_dim: int, action_dim: int):
        super().__init__()
        self.prior = prior
        self.state_dim, self.action_dim = state_dim, action_dim

    def forward(self, belief: torch.Tensor, step_count: torch.Tensor) -> torch.Tensor:
        state = belief.new_zeros(1, self.state_dim)
        action = belief.new_zeros(1, self.action_dim)
        zero = belief.new_zeros(1, belief.shape[-1])
        if isinstance(self.prior, RSSMPriorV3):
            initial = self.prior._belief_and_logits(state, zero, action)[1]
        else:  # V1's RSSMPrior: (mean, std, state, belief); zero noise: no draw from the RNG
            initial = self.prior(state, zero, action, noise=state)[-1]
        # (H,): the same for every env, broadcast over the batch ((…, 1) step counts).
        return torch.where(step_count == 0, initial.reshape(-1).to(belief.dtype), belief)


class ActingPolicy:
    """Mixed into a model set (``modules``, ``obs_key``, ``actor``, and ``state_dim`` /
    ``action_dim``: the widths of the prior's state and action inputs) to give it
    ``policy(explore)``. The model set names its posterior's and prior's outputs
    (their heads differ: Gaussian mean/std in V1, logits in V3) and may add an
    exploration step and a final actor-to-env action step."""

    # The posterior's and prior's outputs, in their order; "state" and
    # ("next", "belief") are the ones the policy carries, the others are scratch.
    POSTERIOR_OUT_KEYS: ClassVar[tuple]
    PRIOR_OUT_KEYS: ClassVar[tuple]

    def exploration_step(self, explore: bool) -> TensorDictModuleBase | None:
        """The module that perturbs the actor's action while collecting, or None."""
        return None

    def env_action_step(self) -> TensorDictModuleBase | None:
        """The module that maps the actor's action to the env's, or None."""
        return None

    def policy(self, explore: bool) -> TensorDictSequential:
        """Acting on real observations; carries the belief to the next step."""
        m = self.modules
        encoder = m["encoder"]
        if self.obs_key == PIXELS_KEY:
            # Preprocess fused with the encoder: no float frame ever lands in the
            # collector's tensordict (it would be copied with every batch).
            encoder = nn.Sequential(m["preprocess"], m["encoder"])
        initial_belief = InitialBeliefAtEpisodeStart(m["prior"], self.state_dim, self.action_dim)
        steps = [
            TensorDictModule(initial_belief, in_keys=["belief", "step_count"], out_keys=["belief"]),
            TensorDictModule(encoder, in_keys=[self.obs_key], out_keys=["_embedding"]),
            TensorDictModule(m["posterior"], in_keys=["belief", "_embedding"], out_keys=list(self.POSTERIOR_OUT_KEYS)),
            self.actor,
        ]
        exploration = self.exploration_step(explore)
        if exploration is not None:
            steps.append(exploration)
        steps.append(
            TensorDictModule(m["prior"], in_keys=["state", "belief", "action"], out_keys=list(self.PRIOR_OUT_KEYS))
        )
        env_action = self.env_action_step()
        if env_action is not None:
            # Last, so the belief above was advanced with the action the world
            # model is trained on.
            steps.append(env_action)
        return TensorDictSequential(*steps)

"""The acting policy every Dreamer model set builds the same way.

What the collector and evaluator run on real observations, one step at a time:
encoder -> posterior -> actor -> [exploration] -> prior (next belief)
-> [actor action to env action]. It carries the belief to the next step.

Key layout (N = envs; S = latent state, H = belief):
  obs                  (N, ...) as the env emits it (uint8 pixels | float vector)
  belief               (N, H)   in: the previous step's ("next", "belief"), zeros at reset
  state                (N, S)   out: the posterior sample
  action               (N, A)   out
  ("next", "belief")   (N, H)   out
"""

from __future__ import annotations

from typing import ClassVar

from tensordict.nn import TensorDictModule, TensorDictModuleBase, TensorDictSequential
from torch import nn

from dreamer.envs.keys import PIXELS_KEY


class ActingPolicy:
    """Mixed into a model set (``modules``, ``obs_key``, ``actor``) to give it
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
        steps = [
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

"""Small env wrappers and transforms the factory composes (action repeat: action_repeat.py)."""

from __future__ import annotations

import gymnasium
import torch
import torch.nn.functional as F
from tensordict import TensorDictBase
from torchrl.data import Bounded
from torchrl.envs import Transform

from dreamer.envs.keys import PIXELS_KEY


class DownsampleUInt8(Transform):
    """Shrink (H, W, C) uint8 frames to (size, size, C) uint8 inside the worker.

    Only for renderers that cannot draw at the stored size (gymnasium's 500x500
    classic-control frames, Atari's 210x160): storing those would cost 60x the
    replay memory. Area interpolation is an average, so no aliasing.
    """

    def __init__(self, size: int, in_key: str = PIXELS_KEY):
        super().__init__(in_keys=[in_key], out_keys=[in_key])
        self.size = size

    def _apply_transform(self, frame: torch.Tensor) -> torch.Tensor:
        # (..., H, W, C) uint8 -> (..., size, size, C) uint8
        lead = frame.shape[:-3]
        chw = frame.reshape(-1, *frame.shape[-3:]).permute(0, 3, 1, 2).float()
        small = F.interpolate(chw, size=(self.size, self.size), mode="area")
        small = small.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
        return small.reshape(*lead, self.size, self.size, frame.shape[-1])

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase):
        return self._call(tensordict_reset)

    def transform_observation_spec(self, observation_spec):
        spec = observation_spec[self.in_keys[0]]
        channels = spec.shape[-1]
        observation_spec[self.in_keys[0]] = Bounded(
            low=0,
            high=255,
            shape=(*spec.shape[:-3], self.size, self.size, channels),
            dtype=torch.uint8,
            device=spec.device,
        )
        return observation_spec


class AtariNoopStart(gymnasium.Wrapper):
    """No-op starts: after each reset, a random number of emulator frames in
    [0, noop_max] pass with the NOOP action, so episodes (and evaluations) start
    from varied states even without sticky actions. Raw frames through ALE
    itself, not agent steps of ``frameskip`` frames, as the protocol counts them.
    """

    def __init__(self, env: gymnasium.Env, noop_max: int):
        super().__init__(env)
        self.noop_max = noop_max

    def reset(self, *, seed=None, options=None):
        from ale_py import Action

        obs, info = self.env.reset(seed=seed, options=options)
        ale = self.env.unwrapped.ale
        for _ in range(int(self.np_random.integers(self.noop_max + 1))):  # seeded by reset(seed=)
            ale.act(Action.NOOP)
            if ale.game_over():  # only a huge noop_max gets here
                return self.env.reset()
        return ale.getScreenRGB(), info  # the frame after the no-ops

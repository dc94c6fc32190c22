"""Image preprocessing on the device that consumes the pixels.

Frames travel and are stored as uint8 (H, W, C); this module turns them into
the float (C, S, S) tensors the networks read, wherever it runs: on the
learner's device after sampling ("GPU image transforms"), and inside the
collector policy on the worker's device. Same code on CPU and CUDA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# ITU-R BT.601 luma weights, as torchvision's rgb_to_grayscale.
_LUMA = (0.2989, 0.587, 0.114)


class PixelPreprocess(nn.Module):
    """uint8 (..., H, W, C) -> float (..., C', size, size) in [-0.5, 0.5].

    C' is 1 with ``grayscale``. Centring at zero follows Dreamer's
    ``obs / 255 - 0.5``; resize is bilinear with antialiasing.
    """

    def __init__(self, image_size: int, grayscale: bool = False):
        super().__init__()
        self.image_size = image_size
        self.grayscale = grayscale
        self.register_buffer("luma", torch.tensor(_LUMA).view(3, 1, 1), persistent=False)

    @property
    def out_channels(self) -> int:
        return 1 if self.grayscale else 3

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        lead = frames.shape[:-3]
        x = frames.reshape(-1, *frames.shape[-3:]).permute(0, 3, 1, 2)  # (N, C, H, W) uint8
        x = x.float().div_(255.0)
        if self.grayscale and x.shape[1] == 3:
            x = (x * self.luma.to(x.dtype)).sum(1, keepdim=True)
        if x.shape[-2:] != (self.image_size, self.image_size):
            x = F.interpolate(
                x, size=(self.image_size, self.image_size), mode="bilinear",
                align_corners=False, antialias=True,
            )
        x = x.sub_(0.5)
        return x.reshape(*lead, *x.shape[1:])


class VectorAsImage(nn.Module):
    """(…, D) -> (…, 1, 1, D): lets TorchRL's DreamerModelLoss, which sums the
    reconstruction error over the last three dims, sum over features only for
    vector observations (instead of over batch and time too)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.unsqueeze(-2).unsqueeze(-2)

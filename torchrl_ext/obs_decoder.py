"""TorchRL's ``ObsDecoder`` with its first transposed convolution computed as one matmul.

``ObsDecoder`` maps the latent to a (D, 1, 1) map and applies a stride-2
``ConvTranspose2d`` to it. On a 1x1 input that layer is a linear map,
``out[n, c, i, j] = sum_d x[n, d] W[d, c, i, j] + b[c]``, but oneDNN runs it as
a general transposed convolution: at Dreamer V1's sizes (1024 -> 128 x 5 x 5,
800 frames per update) forward+backward on a CPU takes many times the matmul.
Same parameters, same state_dict, same outputs (to float rounding).
"""

from __future__ import annotations

import torch
from torchrl.modules.models.model_based import ObsDecoder


class MatmulObsDecoder(ObsDecoder):
    def forward(self, state: torch.Tensor, rnn_hidden: torch.Tensor) -> torch.Tensor:
        latent = self.state_to_latent(torch.cat([state, rnn_hidden], dim=-1))
        *batch_sizes, in_dim = latent.shape
        first = self.decoder[0]
        weight = first.weight  # (in_dim, C, k, k)
        _, channels, kh, kw = weight.shape
        flat = latent.reshape(-1, in_dim)
        if weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous():
            # Weight stored (in_dim, k, k, C): a free view; the output comes out NHWC,
            # the layout the next (channels_last) layers read without a copy.
            cols = weight.permute(0, 2, 3, 1).reshape(in_dim, -1)
            hidden = torch.addmm(first.bias.repeat(kh * kw), flat, cols)
            hidden = hidden.view(-1, kh, kw, channels).permute(0, 3, 1, 2)
        else:
            cols = weight.reshape(in_dim, -1)
            hidden = torch.addmm(first.bias.repeat_interleave(kh * kw), flat, cols)
            hidden = hidden.view(-1, channels, kh, kw)
        obs_decoded = self.decoder[1:](hidden)
        _, c, h, w = obs_decoded.shape
        return obs_decoded.view(*batch_sizes, c, h, w)

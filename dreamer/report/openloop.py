"""Open-loop imagination report: how far ahead the world model sees, as a video.

A few replayed sequences of T steps, as the learner prepares them: the first
``context`` steps are observed (encoder + RSSM posterior: the world model as
it is trained), the remaining T - context steps are predicted open loop from
the recorded actions alone (RSSM prior), and every latent is decoded to an
image (DreamerV3's "openl" report). One video frame per step, a grid:

    rows     true | predicted (posterior reconstructions, then prior
             predictions) | error = |true - predicted| x ERROR_GAIN
    columns  sequences

Works for V1 and V3 alike: both wire the same roles into ``models.modules``
(``preprocess``, ``prior``, ``decoder``) and ``models.world_model``.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torch import nn

from dreamer.config import EnvConfig, EvalConfig
from dreamer.envs.keys import PIXELS_KEY, observation_key
from dreamer.errors import UserError
from torchrl_ext import eager_rollout_step

# Trained reconstructions are off by a few levels out of 255: black at gain 1.
# x4 makes them visible; errors of a quarter of the range and more saturate.
ERROR_GAIN = 4


def openloop_enabled(eval_cfg: EvalConfig, env_cfg: EnvConfig) -> bool:
    """The report needs images: state-observation tasks skip it."""
    return eval_cfg.openloop and observation_key(env_cfg) == PIXELS_KEY


def check_openloop_config(eval_cfg: EvalConfig, env_cfg: EnvConfig, batch_length: int) -> None:
    """At least one step must be left to predict after the observed context."""
    e, length = eval_cfg, batch_length
    if openloop_enabled(eval_cfg, env_cfg) and e.openloop_context >= length:
        raise UserError(
            f"eval.openloop_context={e.openloop_context} leaves no step to predict in "
            f"buffer.batch_length={length} sequences: set eval.openloop_context<={length - 1} "
            "or eval.openloop=false"
        )


def pixel_value_range(preprocess: nn.Module, device: torch.device) -> tuple[float, float]:
    """What the models' own preprocess maps black and white to: V1's
    PixelPreprocess gives (-0.5, 0.5), V3's (with ToUnitRange) (0, 1). Decoders
    predict in that range, so it is what maps their images back to uint8."""
    extremes = torch.tensor([0, 255], dtype=torch.uint8, device=device).view(2, 1, 1, 1).expand(2, 1, 1, 3)
    low, high = preprocess(extremes).flatten(1).mean(1).tolist()  # (2, C, S, S) float -> 2 floats
    return low, high


def to_uint8(images: torch.Tensor, value_range: tuple[float, float]) -> torch.Tensor:
    """(..., C, H, W) float in ``value_range`` -> (..., H, W, 3) uint8 (grey repeated)."""
    low, high = value_range
    pixels = ((images - low) * (255.0 / (high - low))).round_().clamp_(0, 255).to(torch.uint8)
    pixels = pixels.movedim(-3, -1)  # (..., H, W, C)
    return pixels.expand(*pixels.shape[:-1], 3) if pixels.shape[-1] == 1 else pixels


def video_grid(true: torch.Tensor, predicted: torch.Tensor, value_range: tuple[float, float]) -> torch.Tensor:
    """(N, T, C, H, W) float true and predicted images -> (T, 3*H, N*W, 3) uint8 grid video."""
    true_u8 = to_uint8(true, value_range)  # (N, T, H, W, 3) uint8
    pred_u8 = to_uint8(predicted, value_range)  # (N, T, H, W, 3) uint8
    error = (true_u8.short() - pred_u8.short()).abs_().mul_(ERROR_GAIN).clamp_(max=255).to(torch.uint8)
    rows = torch.cat([true_u8, pred_u8, error], dim=2)  # (N, T, 3*H, W, 3)
    n, t, height, width, _ = rows.shape
    return rows.permute(1, 2, 0, 3, 4).reshape(t, height, n * width, 3)  # (T, 3*H, N*W, 3)


@torch.no_grad()
def openloop_video(models, batch: TensorDictBase, *, context: int, sequences: int) -> torch.Tensor:
    """The open-loop grid video of the first ``sequences`` sequences of ``batch``.

    ``models``: DreamerV1Models or DreamerV3Models of a pixel task.
    ``batch``: (B, T) as ``learner.prepare`` returns it (float frames from the
    models' preprocess, actions in the world model's space, zero start latents),
    on the models' device. Returns (T, 3*H, min(sequences, B)*W, 3) uint8 on that device.
    """
    obs_key, m = models.obs_key, models.modules
    length = batch.shape[1]
    if not 0 < context < length:
        raise ValueError(f"context={context} must be in [1, {length - 1}] for sequences of {length} steps")
    batch = batch[:sequences]  # (N, T)
    true = batch.get(("next", obs_key))  # (N, T, C, 64, 64) float

    # The eager RSSM step: a compiled one (compile.rssm_step) is specialised to the
    # update's batch shape and grad mode, and would compile again here.
    with eager_rollout_step(models.world_model):
        observed = models.world_model(batch[:, :context])  # (N, K) posterior rollout + decoder
    reconstructions = observed.get(("next", "reco_" + obs_key))  # (N, K, C, 64, 64) float
    state = observed.get(("next", "state"))[:, -1]  # (N, S) posterior after the last observed step
    belief = observed.get(("next", "belief"))[:, -1]  # (N, H)

    states, beliefs = [], []
    for action in batch.get("action")[:, context:].unbind(1):  # T-K steps of (N, A)
        # RSSMPrior returns (mean, std, state, belief), RSSMPriorV3 (logits,
        # state, belief): both end with the sampled next state and its belief.
        *_, state, belief = m["prior"](state, belief, action)
        states.append(state)
        beliefs.append(belief)
    predictions = m["decoder"](torch.stack(states, 1), torch.stack(beliefs, 1))  # (N, T-K, C, 64, 64) float

    predicted = torch.cat([reconstructions, predictions], dim=1)  # (N, T, C, 64, 64) float
    return video_grid(true, predicted, pixel_value_range(m["preprocess"], true.device))

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
results into the input tensordict; every other key is left as it was. It also
takes upstream ``RSSMRolloutV3``'s ``reset_key``, which the V1 rollout lacks:
where it is set, state, belief and action are zeroed before the prior's step.

``CacheableRSSMPrior``: TorchRL's ``RSSMPrior`` runs its GRU inside
``torch.amp.autocast(enabled=False)`` on every call. Under ``torch.compile`` that
region becomes an ``_enter_autocast`` node, and AOTAutograd never caches a graph
holding one ("Unsupported call_function target _enter_autocast"): a warm start
re-traced and re-partitioned the whole compiled imagination. When autocast is
off this subclass leaves the region out and keeps the rest of it (the GRU in
float32, its output back in the input's dtype); under autocast it is
upstream's forward.

``straight_through_categorical``: upstream's categorical sample (hard one-hot
forward, softmax gradient) with a softmax that stays fast for few classes.
PyTorch's CPU softmax over a last dimension narrower than its vector width
(fewer than 16 float classes with 512-bit vectors, as DreamerV3's size1m latent
of 32 x 4 has) is several times slower than the same softmax taken over a leading
dimension: ``class_softmax`` takes it there (same values to rounding).
``PriorTransition`` is an ``RSSMPriorV3``'s forward for imagination with it.

``LeanRSSMRolloutV3``: TorchRL's ``RSSMRolloutV3`` loop samples a state from
the prior logits at every step and throws it away. Its uniforms are drawn up
front, so the throw-away sample moves no random stream; this subclass skips it
(same draws; its posterior sample is ``straight_through_categorical``'s).

``SplitInputBlockGRU``: the DreamerV3 block GRU feeds every block its own slice
of the belief next to the whole projected (belief, state, action) feature
vector. Upstream builds that input block by block, repeating the features once
per block (``[N, blocks, belief/blocks + 3 * hidden]``), then runs one batched
matmul over narrow blocks. The feature part is the same for every block, so
this subclass multiplies it once, by all blocks' weights side by side (one
wide matmul), and adds the block-diagonal belief part: the same sums in
another order (equal to rounding), no repeated copy. The three input
projections are normalised in one call (one weight per projection).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import nn
from torchrl.modules import RSSMPrior, RSSMRolloutV3
from torchrl.modules.models.model_based import (
    RSSMPriorV3,
    RSSMRollout,
    _DreamerV3BlockGRU,
    _DreamerV3BlockLinear,
    _DreamerV3RMSNorm,
)


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
    def __init__(self, *args, reset_key: NestedKey | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.reset_key = reset_key
        if reset_key is not None:
            self.in_keys = [*self.in_keys, reset_key]

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        rolled = super().forward(tensordict.select(*self.in_keys, strict=False))
        return tensordict.update(rolled)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        reset = tensordict.get(self.reset_key, None) if self.reset_key is not None else None
        if reset is not None:
            for key in ("state", "belief", "action"):
                tensordict.set(key, torch.where(reset, 0, tensordict.get(key)))
        return super()._step(tensordict)


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


# Class counts below which PyTorch's last-dimension CPU softmax takes its slow path.
NARROW_CLASSES = 16


def class_softmax(logits: torch.Tensor) -> torch.Tensor:
    """``torch.softmax(logits, -1)``; over fewer than ``NARROW_CLASSES`` classes it is
    taken over a transposed view (rows then lie along the vectorised dimension)."""
    if logits.shape[-1] >= NARROW_CLASSES or logits.dim() < 2:
        return torch.softmax(logits, -1)
    return torch.softmax(logits.transpose(-1, -2), -2).transpose(-1, -2)


def straight_through_categorical(logits: torch.Tensor, unimix: float = 0.0,
                                 uniform: torch.Tensor | None = None) -> torch.Tensor:
    """One-hot samples of ``logits`` (``[..., categoricals, classes]``) mixed with ``unimix``
    uniform probability, gradients through the probabilities: TorchRL's DreamerV3
    sampler, drawing the same uniforms (``uniform``, else one ``torch.rand`` call)."""
    probs = class_softmax(logits)
    if unimix:
        probs = (1 - unimix) * probs + unimix / logits.shape[-1]
    if uniform is None:
        uniform = torch.rand(probs.shape[:-1], device=probs.device)
    # Inverse-CDF draw: the first class whose cumulative probability exceeds the uniform.
    index = (uniform.unsqueeze(-1) > probs.cumsum(-1)).sum(-1).clamp_max(probs.shape[-1] - 1)
    one_hot = torch.zeros_like(probs).scatter_(-1, index.unsqueeze(-1), 1.0)
    return probs + (one_hot - probs).detach()


class PriorTransition(nn.Module):
    """``prior``'s forward (an ``RSSMPriorV3``: logits, sampled state, belief) with
    :func:`straight_through_categorical`; the weights stay ``prior``'s."""

    def __init__(self, prior: RSSMPriorV3):
        super().__init__()
        self.prior = prior

    def forward(self, state: torch.Tensor, belief: torch.Tensor, action: torch.Tensor):
        logits, belief = self.prior._belief_and_logits(state, belief, action)
        return logits, straight_through_categorical(logits, self.prior.unimix).flatten(-2), belief


class LeanRSSMRolloutV3(RSSMRolloutV3):
    def _loop(self, state, belief, action, embedding, reset):
        posterior_net = self.rssm_posterior.module
        step = self._step_fn or self._step
        steps = action.shape[-2]
        # Drawn as upstream draws them (index 0 fed the discarded prior sample).
        uniforms = torch.rand(
            steps, 2, *action.shape[:-2], self.rssm_prior.module.num_categoricals, device=action.device
        )
        columns = [[] for _ in range(7)]
        for t in range(steps):
            masked_state, masked_belief, action_t, prior_logits_t, belief, posterior_logits_t = step(
                state, belief, action[..., t, :], embedding[..., t, :], reset[..., t, :]
            )
            state = straight_through_categorical(posterior_logits_t, posterior_net.unimix, uniforms[t, 1])
            state = state.flatten(-2)
            for column, value in zip(columns, (masked_state, masked_belief, action_t, prior_logits_t,
                                               posterior_logits_t, state, belief)):
                column.append(value)
        # Logits are (..., categoricals, classes): their time axis sits one further left.
        return tuple(torch.stack(column, -3 if i in (3, 4) else -2) for i, column in enumerate(columns))


class SplitInputBlockGRU(_DreamerV3BlockGRU):
    """Upstream's ``_DreamerV3BlockGRU`` (same parameters and state dict) with a
    cheaper forward; see the module docstring. Turn one into it with
    :func:`split_block_gru_inputs`."""

    UPDATE_BIAS = -1.0  # upstream's forward passes this to its gated update

    def forward(self, state: torch.Tensor, belief: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        action = action / action.detach().abs().clamp_min(1)
        features = self._projected_features(belief, state, action)
        first, *rest = self.hidden_layers
        hidden = self._first_block_linear(first, belief, features)
        for layer in rest:
            hidden = layer(hidden)
        reset, candidate, update = self.gates(hidden).unflatten(-1, (self.num_blocks, 3, -1)).unbind(-2)
        reset = reset.flatten(-2).sigmoid()
        candidate = (reset * candidate.flatten(-2)).tanh()
        update = (update.flatten(-2) + self.UPDATE_BIAS).sigmoid()
        return update * candidate + (1 - update) * belief

    def _projected_features(self, belief: torch.Tensor, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """cat(silu(norm(linear(x)))) over belief, state and action, with one norm call."""
        projections = (self.belief_projection, self.state_projection, self.action_projection)
        linear = torch.cat([p[0](x) for p, x in zip(projections, (belief, state, action))], -1)
        norms = [p[1] for p in projections]
        scales = torch.stack([n.weight for n in norms]).float()  # (3, hidden)
        grouped = linear.unflatten(-1, (3, -1))
        # As upstream's DreamerV3 norm: float32 statistics whatever the activation dtype.
        normed = F.rms_norm(grouped.float(), (grouped.shape[-1],), None, norms[0].eps) * scales
        return F.silu(normed.to(linear.dtype)).flatten(-2)

    def _first_block_linear(self, layer: _DreamerV3BlockLinear, belief: torch.Tensor,
                            features: torch.Tensor) -> torch.Tensor:
        """``layer`` over per-block inputs [belief block j, features], without building them."""
        blocks, block_in, block_out = layer.weight.shape
        belief_block = belief.shape[-1] // blocks
        dtype = features.dtype
        weight = layer.weight.to(dtype)
        # (features, blocks * block_out): block j's feature weights in columns j*block_out...
        feature_weight = weight[:, belief_block:].transpose(0, 1).reshape(block_in - belief_block, -1)
        lead = features.shape[:-1]
        out = torch.addmm(layer.bias.to(dtype), features.reshape(-1, features.shape[-1]), feature_weight)
        grouped = belief.to(dtype).reshape(-1, blocks, belief_block).transpose(0, 1)  # (blocks, N, belief_block)
        from_belief = torch.bmm(grouped, weight[:, :belief_block]).transpose(0, 1).reshape(out.shape)
        return (out + from_belief).reshape(*lead, -1)


def split_block_gru_inputs(prior: nn.Module) -> nn.Module:
    """Give ``prior``'s block GRU (an ``RSSMPriorV3(recurrent_model="block_gru")``) the
    split-input forward; any other recurrent model is left as it is. Same weights."""
    rnn = getattr(prior, "rnn", None)
    if type(rnn) is _DreamerV3BlockGRU and _splittable(rnn):
        rnn.__class__ = SplitInputBlockGRU
    return prior


def _splittable(rnn: _DreamerV3BlockGRU) -> bool:
    first = rnn.hidden_layers[0]
    projections = (rnn.belief_projection, rnn.state_projection, rnn.action_projection)
    return (
        isinstance(first, _DreamerV3BlockLinear)
        and all(len(p) == 3 and type(p[1]) is _DreamerV3RMSNorm for p in projections)
        and len({p[1].eps for p in projections}) == 1
    )

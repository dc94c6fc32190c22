"""Dreamer V3 networks, assembled from TorchRL's V3 modules with explicit keys.

One set of ``nn.Module`` weights (``modules``), wired four ways, as in V1
(dreamer/algos/v1/models.py):
- ``world_model``: encoder -> RSSMRolloutV3 over (B, T) (``rollout``) -> decoder,
  reward (two-hot logits), continue logit: what DreamerV3ModelLoss trains;
- ``model_based_env``: prior + reward head as an imagination env;
- ``actor`` / ``value`` / ``continuation``: heads on (state, belief);
  ``model_based_env`` and ``continuation`` read the world model's weights through
  held-out views (torchrl_ext/held_out.py): the actor loss never trains them;
- ``policy(explore)``: what the collector and evaluator run on real frames.

V3 specifics: symlog on vector inputs and reconstructions, categorical latents
(num_categoricals x num_classes one-hots, unimix), two-hot reward and value
heads over ``num_bins`` symexp-spaced bins, RMS-normalised SiLU MLPs, a policy
head at 1% output scale (a plain categorical for discrete actions).

Continuous actions: the actor acts in [-1, 1] (what the world model and
imagination see); only the acting policy maps them to the env's bounds, and the
learner maps stored env actions back (``to_unit_actions``).

Key layout (B = batch, T = time, S = num_categoricals * num_classes):
  ("next", obs)        (B, T, C, 64, 64) float in [0, 1] | (B, T, D) float
  action               (B, T, A) in [-1, 1] (continuous) or one-hot
  is_first             (B, T, 1) bool: the record is an episode's first observation
  state, belief        (B, T, S), (B, T, H)  zeros in (step 0 read), posterior out
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict.nn import (
    InteractionType,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    TensorDictSequential,
)
from torch import nn
from torchrl.envs import EnvBase
from torchrl.modules import (
    DreamerV3DiscreteActor,
    DreamerV3ImageDecoder,
    DreamerV3ImageEncoder,
    DreamerV3MLP,
    RSSMPosteriorV3,
    RSSMPriorV3,
    SymExpTwoHot,
    WorldModelWrapper,
)
from torchrl.modules.distributions import IndependentNormal
from torchrl.objectives import symexp, symlog

from dreamer.algos.policy import ActingPolicy
from dreamer.config import DreamerV3Config, EnvConfig
from dreamer.data.transforms import PixelPreprocess
from dreamer.envs.factory import is_discrete
from dreamer.envs.keys import IS_FIRST, PIXELS_KEY, observation_key
from torchrl_ext import (
    BatchedRewardDreamerEnv,
    LeanRSSMRolloutV3,
    PriorTransition,
    ScoreFunctionDreamerEnv,
    TraceableOneHotCategorical,
    held_out_view,
    split_block_gru_inputs,
)

# Image encoder stage widths (x encoder_channels): four stride-2 stages, 64 -> 4.
IMAGE_MULTS = (2, 3, 4, 4)
IMAGE_KERNEL = 5
# The paper's bounds on the continuous actor's standard deviation.
ACTOR_MIN_STD, ACTOR_MAX_STD = 0.1, 1.0
# The output scale TorchRL's discrete actor builds its logits head at (algo.policy_outscale rescales it).
UPSTREAM_DISCRETE_OUTSCALE = 0.01


class ImaginationEnv(ScoreFunctionDreamerEnv, BatchedRewardDreamerEnv):
    """The actor loss's model env: imagined rollouts without autograd when the
    actor loss is REINFORCE, rewards scored once over the imagined block."""


class Symlog(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return symlog(x)


class ToUnitRange(nn.Module):
    """PixelPreprocess's [-0.5, 0.5] -> [0, 1], the range TorchRL's V3 image
    encoder (it centres itself) and decoder (it predicts around 0.5) expect."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0.5


class VectorDecoderV3(nn.Module):
    """(state, belief) -> observation: an MLP predicting symlog(obs), then symexp,
    so DreamerV3ModelLoss's symlog squared error is exact on the MLP output."""

    def __init__(self, mlp: DreamerV3MLP):
        super().__init__()
        self.mlp = mlp

    def forward(self, state: torch.Tensor, belief: torch.Tensor) -> torch.Tensor:
        return symexp(self.mlp(state, belief))


class ContinuousActorV3(nn.Module):
    """(state, belief) -> Normal (loc, scale): tanh mean in [-1, 1], std in
    [ACTOR_MIN_STD, ACTOR_MAX_STD] as in the paper."""

    def __init__(self, mlp: DreamerV3MLP):
        super().__init__()
        self.mlp = mlp

    def forward(self, state: torch.Tensor, belief: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, std = self.mlp(state, belief).chunk(2, -1)
        scale = (ACTOR_MAX_STD - ACTOR_MIN_STD) * torch.sigmoid(std + 2.0) + ACTOR_MIN_STD
        return mean.tanh(), scale


class ToEnvBounds(nn.Module):
    """Actor action in [-1, 1] (clipped: Normal samples can leave it) -> [low, high]."""

    def __init__(self, low: torch.Tensor, high: torch.Tensor):
        super().__init__()
        self.register_buffer("low", low, persistent=False)
        self.register_buffer("high", high, persistent=False)

    def forward(self, action: torch.Tensor) -> torch.Tensor:
        return self.low + (action.clamp(-1.0, 1.0) + 1.0) * 0.5 * (self.high - self.low)


@dataclass
class DreamerV3Models(ActingPolicy):
    world_model: TensorDictSequential
    rollout: LeanRSSMRolloutV3  # the world model's loop over time (its step may be compiled: compile.rssm_step)
    model_based_env: ImaginationEnv
    actor: ProbabilisticTensorDictSequential
    value: TensorDictSequential
    continuation: TensorDictSequential
    modules: nn.ModuleDict  # every trainable weight, by role (for optimisers/checkpoints)
    obs_key: str
    discrete: bool
    action_low: torch.Tensor  # env bounds (continuous); the actor's [-1, 1] maps onto them
    action_high: torch.Tensor

    @property
    def state_dim(self) -> int:
        prior = self.modules["prior"]
        return prior.num_categoricals * prior.num_classes

    @property
    def action_dim(self) -> int:
        return self.action_low.shape[-1]

    def to_unit_actions(self, action: torch.Tensor) -> torch.Tensor:
        """Env actions (as stored in replay) -> the actor's [-1, 1]; one-hots unchanged."""
        if self.discrete:
            return action
        return (action - self.action_low) / (self.action_high - self.action_low) * 2.0 - 1.0

    # policy(explore) (dreamer.algos.policy): categorical posterior and prior heads.
    # V3 explores with the actor's own distribution (no added noise): the
    # collector samples it, evaluation takes its mode (the exploration type the
    # caller sets), so ``explore`` changes nothing (no exploration_step).
    POSTERIOR_OUT_KEYS = ("_posterior_logits", "state")
    PRIOR_OUT_KEYS = ("_prior_logits", "_prior_state", ("next", "belief"))

    def env_action_step(self) -> TensorDictModule | None:
        """Continuous actions: the actor's [-1, 1] -> the env's bounds."""
        if self.discrete:
            return None
        bounds = ToEnvBounds(self.action_low, self.action_high)
        return TensorDictModule(bounds, in_keys=["action"], out_keys=["action"])


def _mlp(a, in_features: int, out_features: int | None, device, outscale: float = 1.0) -> DreamerV3MLP:
    return DreamerV3MLP(
        in_features, out_features, depth=a.mlp_layers, num_cells=a.hidden_dim,
        outscale=outscale, device=device,
    )


def build_models(algo_cfg: DreamerV3Config, env_cfg: EnvConfig, env: EnvBase, device: torch.device) -> DreamerV3Models:
    """Networks sized from ``algo_cfg`` and the env's specs (``env_cfg``: which
    observation, image size, grayscale), on ``device``.

    Built in one order (observation networks, RSSM and heads, actor), which is
    the order their weights are initialised from the seed and listed in
    ``modules`` (optimisers, checkpoints); then wired into the world model, the
    imagination env and the value and continuation modules.
    """
    a = algo_cfg
    obs_key = observation_key(env_cfg)
    discrete = is_discrete(env)
    action_dim = env.action_spec_unbatched.shape[-1]
    modules = nn.ModuleDict()
    if obs_key == PIXELS_KEY:
        embed_dim = _add_image_networks(modules, a, env_cfg, device)
    else:
        embed_dim = _add_vector_networks(modules, a, env.observation_spec[obs_key].shape[-1], device)
    _add_rssm_and_heads(modules, a, action_dim, embed_dim, device)
    two_hot = SymExpTwoHot(a.num_bins).to(device)  # logits -> scalar; no weights
    actor = _add_actor(modules, a, action_dim, discrete, device)
    rollout = _rollout(modules)
    low, high = _action_bounds(env, discrete)
    return DreamerV3Models(
        world_model=_world_model(modules, rollout, obs_key), rollout=rollout,
        model_based_env=_imagination_env(modules, a, env, two_hot, device), actor=actor,
        value=TensorDictSequential(
            TensorDictModule(modules["value"], in_keys=["state", "belief"], out_keys=["state_value_logits"]),
            TensorDictModule(two_hot, in_keys=["state_value_logits"], out_keys=["state_value"]),
        ),
        continuation=TensorDictSequential(
            TensorDictModule(
                held_out_view(modules["continuation"]), in_keys=["state", "belief"], out_keys=["continue_logits"]
            ),
            TensorDictModule(nn.Sigmoid(), in_keys=["continue_logits"], out_keys=["continuation"]),
        ),
        modules=modules, obs_key=obs_key, discrete=discrete, action_low=low.to(device), action_high=high.to(device),
    )


def _latent_dim(a: DreamerV3Config) -> int:
    """Width of (state, belief), what the decoder and every head read."""
    return a.latent_state_dim + a.rssm_hidden_dim


def _action_bounds(env: EnvBase, discrete: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The env's action bounds (continuous actions); zeros for discrete ones."""
    action_spec = env.action_spec_unbatched
    if discrete:
        low = high = torch.zeros(action_spec.shape[-1])
        return low, high
    return action_spec.space.low.float(), action_spec.space.high.float()


def _add_image_networks(modules: nn.ModuleDict, a: DreamerV3Config, env_cfg: EnvConfig, device: torch.device) -> int:
    """Pixel preprocessing to [0, 1], conv encoder and decoder; returns the embedding width."""
    pre = PixelPreprocess(env_cfg.image_size, env_cfg.grayscale)
    modules["preprocess"] = nn.Sequential(pre, ToUnitRange()).to(device)
    image_shape = (pre.out_channels, env_cfg.image_size, env_cfg.image_size)
    modules["encoder"] = DreamerV3ImageEncoder(
        in_channels=pre.out_channels, depth=a.encoder_channels, mults=IMAGE_MULTS,
        kernel_size=IMAGE_KERNEL, device=device,
    )
    embed_dim = modules["encoder"].output_features(image_shape)
    modules["decoder"] = DreamerV3ImageDecoder(
        in_features=_latent_dim(a), image_shape=image_shape, depth=a.encoder_channels, mults=IMAGE_MULTS,
        kernel_size=IMAGE_KERNEL, num_blocks=1, device=device,
    )
    return embed_dim


def _add_vector_networks(modules: nn.ModuleDict, a: DreamerV3Config, obs_dim: int, device: torch.device) -> int:
    """Symlog MLP encoder and decoder of a state vector; returns the embedding width."""
    modules["encoder"] = nn.Sequential(Symlog(), _mlp(a, obs_dim, None, device))
    modules["decoder"] = VectorDecoderV3(_mlp(a, _latent_dim(a), obs_dim, device))
    return a.hidden_dim


def _add_rssm_and_heads(modules: nn.ModuleDict, a: DreamerV3Config, action_dim: int, embed_dim: int,
                        device: torch.device) -> None:
    """The RSSM's prior and posterior, and the reward, continuation and value heads."""
    # The block GRU's forward that skips repeating the features per block (same weights).
    modules["prior"] = split_block_gru_inputs(RSSMPriorV3(
        action_shape=torch.Size([action_dim]), action_dim=action_dim, hidden_dim=a.hidden_dim,
        rnn_hidden_dim=a.rssm_hidden_dim, num_categoricals=a.num_categoricals,
        num_classes=a.num_classes, unimix=a.unimix, device=device,
        recurrent_model="block_gru" if a.gru_blocks > 1 else "gru", num_blocks=a.gru_blocks,
    ))
    modules["posterior"] = RSSMPosteriorV3(
        hidden_dim=a.hidden_dim, num_categoricals=a.num_categoricals, num_classes=a.num_classes,
        rnn_hidden_dim=a.rssm_hidden_dim, obs_embed_dim=embed_dim, use_rms_norm=True,
        unimix=a.unimix, device=device,
    )
    latent = _latent_dim(a)
    # Zero-initialised output layers (outscale=0): reward and value start at 0.
    modules["reward"] = _mlp(a, latent, a.num_bins, device, outscale=0.0)
    modules["continuation"] = _mlp(a, latent, 1, device)
    modules["value"] = _mlp(a, latent, a.num_bins, device, outscale=0.0)


def _add_actor(modules: nn.ModuleDict, a: DreamerV3Config, action_dim: int, discrete: bool,
               device: torch.device) -> ProbabilisticTensorDictSequential:
    """The actor: unimix categorical over discrete actions, or a normal in [-1, 1]."""
    latent = _latent_dim(a)
    if discrete:
        # A plain categorical, as the reference's policy head (its unimix mixes latents only).
        actor = DreamerV3DiscreteActor(
            latent, action_dim, depth=a.mlp_layers, num_cells=a.hidden_dim, unimix=0.0,
            in_keys=["state", "belief"], device=device,
        )
        actor[1].distribution_class = TraceableOneHotCategorical  # upstream's draws, without a graph break
        with torch.no_grad():
            actor[0].module.logits_head.weight.mul_(a.policy_outscale / UPSTREAM_DISCRETE_OUTSCALE)
        modules["actor"] = actor
        return actor
    # At the reference's 1% output scale the first actions are near tanh(0) = 0 with a
    # wide std, not spread by random output weights.
    modules["actor"] = ContinuousActorV3(_mlp(a, latent, 2 * action_dim, device, outscale=a.policy_outscale))
    return ProbabilisticTensorDictSequential(
        TensorDictModule(modules["actor"], in_keys=["state", "belief"], out_keys=["loc", "scale"]),
        ProbabilisticTensorDictModule(
            in_keys=["loc", "scale"], out_keys=["action"],
            distribution_class=IndependentNormal,
            default_interaction_type=InteractionType.RANDOM,
        ),
    )


def _rollout(modules: nn.ModuleDict) -> LeanRSSMRolloutV3:
    """The RSSM over (B, T): prior then posterior at every step."""
    return LeanRSSMRolloutV3(
        TensorDictModule(
            modules["prior"], in_keys=["state", "belief", "action"],
            out_keys=[("next", "prior_logits"), ("next", "state"), ("next", "belief")],
        ),
        TensorDictModule(
            modules["posterior"], in_keys=[("next", "belief"), ("next", "encoded_latents")],
            out_keys=[("next", "posterior_logits"), ("next", "state")],
        ),
        # State, belief and action zeroed where an episode starts (sequences run across
        # episode ends), then the prior: the initial belief acting uses too (ActingPolicy).
        reset_key=IS_FIRST,
    )


def _world_model(modules: nn.ModuleDict, rollout: LeanRSSMRolloutV3, obs_key: str) -> TensorDictSequential:
    """encoder -> rollout -> decoder, reward logits, continue logit: what DreamerV3ModelLoss trains."""
    latent_next = [("next", "state"), ("next", "belief")]
    return TensorDictSequential(
        TensorDictModule(modules["encoder"], in_keys=[("next", obs_key)], out_keys=[("next", "encoded_latents")]),
        rollout,
        TensorDictModule(modules["decoder"], in_keys=latent_next, out_keys=[("next", "reco_" + obs_key)]),
        # Reward logits only: the loss reads them, nothing reads a decoded reward here.
        TensorDictModule(modules["reward"], in_keys=latent_next, out_keys=[("next", "reward_logits")]),
        TensorDictModule(modules["continuation"], in_keys=latent_next, out_keys=[("next", "continue_pred")]),
    )


def _imagination_env(modules: nn.ModuleDict, a: DreamerV3Config, env: EnvBase, two_hot: nn.Module,
                     device: torch.device) -> ImaginationEnv:
    """The prior and the reward head as an env the actor imagines in (latents only)."""
    # The learner sets rollout_gradients=False for a REINFORCE actor loss.
    model_based_env = ImaginationEnv(
        world_model=WorldModelWrapper(
            # The prior's step with a categorical sampler that stays fast for few classes.
            TensorDictModule(
                PriorTransition(held_out_view(modules["prior"])), in_keys=["state", "belief", "action"],
                out_keys=["_", "state", "belief"],
            ),
            TensorDictSequential(
                TensorDictModule(
                    held_out_view(modules["reward"]), in_keys=["state", "belief"], out_keys=["reward_logits"]
                ),
                TensorDictModule(two_hot, in_keys=["reward_logits"], out_keys=["reward"]),
            ),
        ),
        prior_shape=torch.Size([a.latent_state_dim]),
        belief_shape=torch.Size([a.rssm_hidden_dim]),
        device=device,
    )
    model_based_env.set_specs_from_env(env)
    # Imagination produces latents only, no observations.
    model_based_env.observation_spec = model_based_env.state_spec.clone()
    # Keys and done templates computed now: the traced update reads them, never fills a cache.
    return model_based_env.to(device).fix_specs()

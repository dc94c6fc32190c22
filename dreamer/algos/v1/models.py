"""Dreamer V1 networks, assembled from TorchRL modules with explicit keys.

One set of ``nn.Module`` weights, wired four ways:
- ``world_model``: encoder -> RSSM rollout over (B, T) -> decoder, plus the
  reward head (what :class:`~torchrl.objectives.DreamerModelLoss` trains);
- ``model_based_env``: the prior + reward head as an imagination env;
- ``actor`` / ``value``: heads on (state, belief), for imagination;
- ``policy(explore)``: what the collector and evaluator run on real frames:
  encoder -> posterior -> actor -> [noise] -> prior (next belief).

Key layout (B = batch, T = time):
  ("next", obs)        (B, T, 3, 64, 64) float | (B, T, 1, 1, D) float
  action               (B, T, A)
  is_first             (B, T, 1) bool: the record is an episode's first observation
  state, belief        (B, T, S), (B, T, H)  zeros in (step 0 read), posterior out
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict.nn import (
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    TensorDictSequential,
)
from torch import nn
from torchrl.envs import DreamerEnv, EnvBase
from torchrl.modules import (
    MLP,
    AdditiveGaussianModule,
    DreamerActor,
    EGreedyModule,
    ObsEncoder,
    OneHotCategorical,
    RSSMPosterior,
    WorldModelWrapper,
)
from torchrl.modules.distributions import ReparamGradientStrategy

from dreamer.algos.policy import ActingPolicy
from dreamer.config import DreamerV1Config, EnvConfig
from dreamer.data.transforms import PixelPreprocess
from dreamer.envs.factory import is_discrete
from dreamer.envs.keys import IS_FIRST, PIXELS_KEY, observation_key
from torchrl_ext import (
    CacheableRSSMPrior,
    FixedBoundsTanhNormal,
    MatmulObsDecoder,
    NonTerminatingDreamerEnv,
    SelectiveRSSMRollout,
    held_out_view,
)

ACTIVATIONS = {"elu": nn.ELU, "relu": nn.ReLU, "silu": nn.SiLU, "tanh": nn.Tanh}


class VectorDecoder(nn.Module):
    """(state, belief) -> (…, 1, 1, D): the vector twin of ObsDecoder's image output."""

    def __init__(self, mlp: nn.Module):
        super().__init__()
        self.mlp = mlp

    def forward(self, state: torch.Tensor, belief: torch.Tensor) -> torch.Tensor:
        return self.mlp(state, belief).unsqueeze(-2).unsqueeze(-2)


@dataclass
class DreamerV1Models(ActingPolicy):
    world_model: WorldModelWrapper
    model_based_env: DreamerEnv
    actor: ProbabilisticTensorDictSequential
    value: TensorDictModule
    modules: nn.ModuleDict  # every trainable weight, by role (for optimisers/checkpoints)
    obs_key: str
    discrete: bool
    exploration: TensorDictModule

    # policy(explore) (dreamer.algos.policy): Gaussian posterior and prior heads.
    POSTERIOR_OUT_KEYS = ("_posterior_mean", "_posterior_std", "state")
    PRIOR_OUT_KEYS = ("_prior_mean", "_prior_std", "_prior_state", ("next", "belief"))

    def exploration_step(self, explore: bool) -> TensorDictModule | None:
        return self.exploration if explore else None

    @property
    def state_dim(self) -> int:
        return self.modules["prior"].state_dim

    @property
    def action_dim(self) -> int:
        return self.modules["prior"].action_shape[-1]


def _action_bounds(env: EnvBase) -> tuple[torch.Tensor, torch.Tensor]:
    spec = env.action_spec_unbatched
    return spec.space.low.float(), spec.space.high.float()


def build_models(algo_cfg: DreamerV1Config, env_cfg: EnvConfig, env: EnvBase, device: torch.device) -> DreamerV1Models:
    """Networks sized from ``algo_cfg`` and the env's specs (``env_cfg``: which
    observation, image size, grayscale), on ``device``.

    Built in one order (observation networks, RSSM and heads, actor), which is
    the order their weights are initialised from the seed and listed in
    ``modules`` (optimisers, checkpoints); then wired into the world model, the
    imagination env and the value module.
    """
    a = algo_cfg
    obs_key = observation_key(env_cfg)
    discrete = is_discrete(env)
    action_spec = env.action_spec_unbatched.to(device)
    modules = nn.ModuleDict()
    if obs_key == PIXELS_KEY:
        wm_encoder, wm_decoder, embed_dim = _add_image_networks(modules, a, env_cfg, device)
    else:
        wm_encoder, wm_decoder, embed_dim = _add_vector_networks(modules, a, env.observation_spec[obs_key].shape[-1],
                                                                 device)
    _add_rssm_and_heads(modules, a, action_spec, embed_dim, device)
    actor, exploration = _add_actor(modules, a, env, action_spec, discrete, device)
    value = TensorDictModule(modules["value"], in_keys=["state", "belief"], out_keys=["state_value"])
    return DreamerV1Models(
        world_model=_world_model(modules, wm_encoder, wm_decoder, obs_key),
        model_based_env=_imagination_env(modules, a, env, device), actor=actor, value=value,
        modules=modules, obs_key=obs_key, discrete=discrete, exploration=exploration,
    )


def _latent_dim(a: DreamerV1Config) -> int:
    """Width of (state, belief), what the decoder and every head read."""
    return a.state_dim + a.rssm_hidden_dim


def _add_image_networks(modules: nn.ModuleDict, a: DreamerV1Config, env_cfg: EnvConfig,
                        device: torch.device) -> tuple[nn.Module, nn.Module, int]:
    """Pixel preprocessing, conv encoder and decoder: (world-model encoder, decoder, embedding width)."""
    pre = PixelPreprocess(env_cfg.image_size, env_cfg.grayscale).to(device)
    modules["preprocess"] = pre
    modules["encoder"] = ObsEncoder(
        channels=a.encoder_channels, in_channels=pre.out_channels, device=device
    )
    with torch.no_grad():
        probe = torch.zeros(1, pre.out_channels, env_cfg.image_size, env_cfg.image_size, device=device)
        embed_dim = modules["encoder"](probe).shape[-1]
    modules["decoder"] = MatmulObsDecoder(
        channels=a.encoder_channels, latent_dim=_latent_dim(a), out_channels=pre.out_channels, device=device
    )
    if a.channels_last:
        # NHWC is oneDNN's native conv layout on CPU (and cuDNN's fast one), and
        # the (H, W, C) frames are already NHWC after PixelPreprocess's permute,
        # so the encoder reads them with no transposing copy.
        for name in ("encoder", "decoder"):
            modules[name].to(memory_format=torch.channels_last)
    return modules["encoder"], modules["decoder"], embed_dim


def _add_vector_networks(modules: nn.ModuleDict, a: DreamerV1Config, obs_dim: int,
                         device: torch.device) -> tuple[nn.Module, nn.Module, int]:
    """MLP encoder and decoder of a state vector: (world-model encoder, decoder, embedding width)."""
    act = ACTIVATIONS[a.activation]
    embed_dim = a.hidden_dim
    modules["encoder"] = MLP(
        in_features=obs_dim, out_features=embed_dim, depth=2, num_cells=a.hidden_dim,
        activation_class=act, device=device,
    )
    modules["decoder"] = VectorDecoder(
        MLP(in_features=_latent_dim(a), out_features=obs_dim, depth=2, num_cells=a.hidden_dim,
            activation_class=act, device=device)
    )
    # The learner stores vectors as (…, 1, 1, D); see transforms.VectorAsImage.
    return nn.Sequential(nn.Flatten(-3), modules["encoder"]), modules["decoder"], embed_dim


def _add_rssm_and_heads(modules: nn.ModuleDict, a: DreamerV1Config, action_spec, embed_dim: int,
                        device: torch.device) -> None:
    """The RSSM's prior and posterior, the reward head and the value head."""
    act, latent = ACTIVATIONS[a.activation], _latent_dim(a)
    modules["prior"] = CacheableRSSMPrior(
        action_spec=action_spec, hidden_dim=a.rssm_hidden_dim, rnn_hidden_dim=a.rssm_hidden_dim,
        state_dim=a.state_dim, action_dim=action_spec.shape[-1], device=device,
    )
    modules["posterior"] = RSSMPosterior(
        hidden_dim=a.rssm_hidden_dim, state_dim=a.state_dim, rnn_hidden_dim=a.rssm_hidden_dim,
        obs_embed_dim=embed_dim, device=device,
    )
    modules["reward"] = MLP(
        in_features=latent, out_features=1, depth=2, num_cells=a.hidden_dim,
        activation_class=act, device=device,
    )
    modules["value"] = MLP(
        in_features=latent, out_features=1, depth=3, num_cells=a.hidden_dim,
        activation_class=act, device=device,
    )


def _add_actor(modules: nn.ModuleDict, a: DreamerV1Config, env: EnvBase, action_spec, discrete: bool,
               device: torch.device) -> tuple[ProbabilisticTensorDictSequential, TensorDictModule]:
    """The actor (one-hot categorical or tanh-normal in the env's bounds) and
    its exploration while collecting (epsilon-greedy or additive Gaussian)."""
    if discrete:
        actor, exploration = _discrete_actor(modules, a, action_spec, device)
    else:
        actor, exploration = _continuous_actor(modules, a, env, action_spec, device)
    # DreamerActor builds its first layer lazily; materialise it before
    # optimisers, compile and checkpoints see the parameters.
    with torch.no_grad():
        modules["actor"](torch.zeros(1, a.state_dim, device=device), torch.zeros(1, a.rssm_hidden_dim, device=device))
    return actor, exploration


def _discrete_actor(modules: nn.ModuleDict, a: DreamerV1Config, action_spec,
                    device: torch.device) -> tuple[ProbabilisticTensorDictSequential, TensorDictModule]:
    modules["actor"] = MLP(
        in_features=_latent_dim(a), out_features=action_spec.shape[-1], depth=3, num_cells=a.hidden_dim,
        activation_class=ACTIVATIONS[a.activation], device=device,
    )
    actor = ProbabilisticTensorDictSequential(
        TensorDictModule(modules["actor"], in_keys=["state", "belief"], out_keys=["logits"]),
        ProbabilisticTensorDictModule(
            in_keys=["logits"], out_keys=["action"],
            distribution_class=OneHotCategorical,
            # Straight-through gradients through the sampled one-hot action.
            distribution_kwargs={"grad_method": ReparamGradientStrategy.PassThrough},
        ),
    )
    exploration = EGreedyModule(
        action_spec, eps_init=a.exploration_noise, eps_end=a.exploration_noise,
        annealing_num_steps=1,
    )
    return actor, exploration


def _continuous_actor(modules: nn.ModuleDict, a: DreamerV1Config, env: EnvBase, action_spec,
                      device: torch.device) -> tuple[ProbabilisticTensorDictSequential, TensorDictModule]:
    modules["actor"] = DreamerActor(
        out_features=action_spec.shape[-1], depth=3, num_cells=a.hidden_dim,
        activation_class=ACTIVATIONS[a.activation], device=device,
    )
    low, high = _action_bounds(env)
    FixedBoundsTanhNormal.check_bounds(low, high)
    actor = ProbabilisticTensorDictSequential(
        TensorDictModule(modules["actor"], in_keys=["state", "belief"], out_keys=["loc", "scale"]),
        ProbabilisticTensorDictModule(
            in_keys=["loc", "scale"], out_keys=["action"],
            distribution_class=FixedBoundsTanhNormal,
            # The env's own bounds: a [-1, 1] squash would use half of
            # Pendulum's torque range.
            distribution_kwargs={"low": low.to(device), "high": high.to(device), "tanh_loc": True},
        ),
    )
    exploration = AdditiveGaussianModule(
        spec=action_spec, sigma_init=1.0, sigma_end=1.0, annealing_num_steps=1, mean=0.0,
        std=a.exploration_noise * float((high - low).mean() / 2), device=device,
    )
    return actor, exploration


def _world_model(modules: nn.ModuleDict, wm_encoder: nn.Module, wm_decoder: nn.Module,
                 obs_key: str) -> WorldModelWrapper:
    """encoder -> RSSM rollout over (B, T) -> decoder, and the reward head: what
    DreamerModelLoss trains."""
    rollout = SelectiveRSSMRollout(
        TensorDictModule(
            modules["prior"], in_keys=["state", "belief", "action"],
            out_keys=[("next", "prior_mean"), ("next", "prior_std"), "_", ("next", "belief")],
        ),
        TensorDictModule(
            modules["posterior"], in_keys=[("next", "belief"), ("next", "encoded_latents")],
            out_keys=[("next", "posterior_mean"), ("next", "posterior_std"), ("next", "state")],
        ),
        # Sequences run across episode ends: state, belief and action zeroed where one starts.
        reset_key=IS_FIRST,
    )
    return WorldModelWrapper(
        TensorDictSequential(
            TensorDictModule(wm_encoder, in_keys=[("next", obs_key)], out_keys=[("next", "encoded_latents")]),
            rollout,
            TensorDictModule(
                wm_decoder, in_keys=[("next", "state"), ("next", "belief")],
                out_keys=[("next", "reco_" + obs_key)],
            ),
        ),
        TensorDictModule(
            modules["reward"], in_keys=[("next", "state"), ("next", "belief")], out_keys=[("next", "reward")]
        ),
    )


def _imagination_env(modules: nn.ModuleDict, a: DreamerV1Config, env: EnvBase, device: torch.device) -> DreamerEnv:
    """The prior and the reward head as an env the actor imagines in, through held-out views
    of their weights (torchrl_ext/held_out.py): imagining never trains the world model."""
    # Imagined rollouts never test for done: no host sync per imagined step.
    model_based_env = NonTerminatingDreamerEnv(
        world_model=WorldModelWrapper(
            TensorDictModule(
                held_out_view(modules["prior"]), in_keys=["state", "belief", "action"],
                out_keys=["_", "_", "state", "belief"],
            ),
            TensorDictModule(held_out_view(modules["reward"]), in_keys=["state", "belief"], out_keys=["reward"]),
        ),
        prior_shape=torch.Size([a.state_dim]),
        belief_shape=torch.Size([a.rssm_hidden_dim]),
        device=device,
    )
    model_based_env.set_specs_from_env(env)
    # Keys and done templates computed now: the traced update reads them, never fills a cache.
    return model_based_env.to(device).fix_specs()

"""Dreamer V1 learner: TorchRL's three losses, three fused-Adam optimisers that
skip a non-finite step in the kernel (the skeleton: dreamer/algos/learner.py)."""

from __future__ import annotations

import copy

import torch
from tensordict import TensorDictBase
from torchrl.objectives import DreamerActorLoss, DreamerModelLoss, DreamerValueLoss

from dreamer.algos.learner import BaseLearner, PhaseOut, param_groups
from dreamer.algos.nonfinite import SkipInStep
from dreamer.algos.v1.models import DreamerV1Models
from dreamer.config import CompileConfig, DreamerV1Config
from dreamer.data.transforms import VectorAsImage
from dreamer.envs.keys import PIXELS_KEY
from torchrl_ext import held_out_view, masked_lerp_

METRIC_NAMES = (
    "loss_model_kl",
    "loss_model_reco",
    "loss_model_reward",
    "loss_actor",
    "loss_value",
    "grad_norm_world_model",
    "grad_norm_actor",
    "grad_norm_value",
)
WORLD_MODEL_PARTS = ("encoder", "decoder", "prior", "posterior", "reward")


def _adam(params, lr: float, eps: float) -> torch.optim.Adam:
    # Fused kernels (CUDA and CPU): only they take a device-side found_inf flag
    # that skips a non-finite step without a host sync (see dreamer.algos.nonfinite).
    return torch.optim.Adam(params, lr=lr, eps=eps, fused=True)


class DreamerV1Learner(BaseLearner):
    METRIC_NAMES = METRIC_NAMES
    # torch.optim.Adam.step breaks dynamo's graph on purpose (torch/optim/optimizer.py
    # _use_grad); a step through the functional torch.optim.adam.adam(fused=True,
    # found_inf=...), with its state created beforehand, would lift it. The eager update
    # has no such break: it can be captured (compile=off compile.update=captured, and compile.update=auto on CUDA).
    NO_COMPILED_WHOLE_UPDATE = "torch.optim.Adam.step breaks the graph on purpose"

    def __init__(
        self,
        algo_cfg: DreamerV1Config,
        compile_cfg: CompileConfig,
        models: DreamerV1Models,
        device: torch.device,
        *,
        batch_size: int,
        batch_length: int,
        autocast_dtype: torch.dtype | None = None,
    ):
        a = algo_cfg
        obs_key = models.obs_key
        # Unscaled terms: the learner weighs them (loss_scales).
        self.world_model_loss = DreamerModelLoss(models.world_model, lambda_kl=1.0, free_nats=a.free_nats)
        self.world_model_loss.set_keys(pixels=obs_key, reco_pixels="reco_" + obs_key)
        # The critic the lambda-returns bootstrap from: the trained one (the paper), through
        # a held-out view of its weights, or a slow copy of it that no optimiser holds
        # (algo.slow_value_tau > 0).
        self.slow_value = copy.deepcopy(models.value).requires_grad_(False) if a.slow_value_tau > 0 else None
        self.actor_loss = DreamerActorLoss(
            models.actor, held_out_view(models.value) if self.slow_value is None else self.slow_value,
            models.model_based_env,
            imagination_horizon=a.imagination_horizon, discount_loss=True,
        )
        # time_dim=-2: DreamerActorLoss hands the estimator a batch-less tensordict
        # of (N, H, 1) tensors, so by default it recurses over the trailing
        # singleton dim and every "lambda-return" collapses to r_t + gamma * V_t+1.
        # vectorized=False: the vectorized form calls .item() every update (a host
        # sync on CUDA); the loop form is sync-free.
        self.actor_loss.make_value_estimator(
            gamma=a.gamma, lmbda=a.lmbda, vectorized=False, time_dim=-2
        )
        self.value_loss = DreamerValueLoss(models.value, discount_loss=True, gamma=a.gamma)

        params = param_groups(models.modules, WORLD_MODEL_PARTS)
        lrs = {"world_model": a.world_model_lr, "actor": a.actor_lr, "value": a.value_lr}
        super().__init__(
            algo_cfg, compile_cfg, models, device,
            batch_size=batch_size, batch_length=batch_length, autocast_dtype=autocast_dtype,
            params=params,
            loss_scales={
                "loss_model_kl": a.kl_scale, "loss_model_reco": 1.0, "loss_model_reward": 1.0,
                "loss_actor": 1.0, "loss_value": 1.0,
            },
            optimizers={name: _adam(p, lrs[name], a.adam_eps) for name, p in params.items()},
            nonfinite_policy=SkipInStep(),
            grad_clip=a.grad_clip,
            compilable={"actor": self.actor_loss, "value": self.value_loss},
        )
        self._vector_as_image = VectorAsImage()

    # -- data -----------------------------------------------------------------
    def _prepare_inputs(self, batch: TensorDictBase) -> TensorDictBase:
        obs = batch.get(("next", self.obs_key))
        if self.obs_key == PIXELS_KEY:
            # (B, T, 64, 64, 3) uint8 -> (B, T, C, 64, 64) float in [-0.5, 0.5]
            obs = self.models.modules["preprocess"](obs)
        else:
            obs = self._vector_as_image(obs)  # (B, T, D) -> (B, T, 1, 1, D)
        batch.set(("next", self.obs_key), obs)
        return batch

    # -- the phases -------------------------------------------------------------
    def _world_model_phase(self, batch: TensorDictBase) -> PhaseOut:
        wm_td, latent = self.world_model_loss(batch)  # latent: (B, T) posterior states
        names = ("loss_model_kl", "loss_model_reco", "loss_model_reward")
        return PhaseOut({k: wm_td[k].squeeze() for k in names}, {}, latent)

    def _actor_phase(self, latent: TensorDictBase) -> PhaseOut:
        actor_td, imagined = self.loss_fns["actor"](self.imagination_starts(latent))
        return PhaseOut({"loss_actor": actor_td["loss_actor"].squeeze()}, {}, imagined)

    def _value_phase(self, batch: TensorDictBase, latent: TensorDictBase, imagined: TensorDictBase) -> PhaseOut:
        value_td, _ = self.loss_fns["value"](imagined)
        return PhaseOut({"loss_value": value_td["loss_value"].squeeze()}, {})

    def _after_value_step(self, skipped: torch.Tensor) -> None:
        if self.slow_value is not None:  # a skipped update leaves it where it was
            with torch.no_grad():
                masked_lerp_(list(self.slow_value.parameters()), list(self.models.value.parameters()),
                              self.algo_cfg.slow_value_tau, skipped)

    # -- checkpoint -----------------------------------------------------------
    def _extra_state(self) -> dict:
        return {} if self.slow_value is None else {"slow_value": self.slow_value.state_dict()}

    def _load_extra_state(self, state: dict) -> None:
        if self.slow_value is not None:
            # A checkpoint saved without one (slow_value_tau was 0) starts it at the critic.
            self.slow_value.load_state_dict(state.get("slow_value", self.models.value.state_dict()))

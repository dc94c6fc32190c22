"""Dreamer V1 learner: TorchRL's three losses, three fused-Adam optimisers, a
sync-free update (the contract and shared parts: dreamer/learner_base.py)."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torch.nn.utils import clip_grad_norm_
from torch.profiler import record_function
from torchrl.objectives import DreamerActorLoss, DreamerModelLoss, DreamerValueLoss

from dreamer.config import Config
from dreamer.envs.factory import PIXELS_KEY
from dreamer.algos.learner import BaseLearner
from dreamer.algos.v1.models import DreamerV1Models
from dreamer.data.transforms import VectorAsImage

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
    # that skips a non-finite step without a host sync (see dreamer.health).
    return torch.optim.Adam(params, lr=lr, eps=eps, fused=True)


class DreamerV1Learner(BaseLearner):
    METRIC_NAMES = METRIC_NAMES

    def __init__(
        self,
        cfg: Config,
        models: DreamerV1Models,
        device: torch.device,
        autocast_dtype: torch.dtype | None = None,
    ):
        super().__init__(cfg, models, device, autocast_dtype)
        a = cfg.algo
        self.grad_clip = a.grad_clip

        self.world_model_loss = DreamerModelLoss(
            models.world_model, lambda_kl=a.kl_scale, free_nats=a.free_nats
        )
        self.world_model_loss.set_keys(pixels=self.obs_key, reco_pixels="reco_" + self.obs_key)
        self.actor_loss = DreamerActorLoss(
            models.actor, models.value, models.model_based_env,
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
        # Called through these; compile() swaps in compiled versions.
        self._actor_loss_fn = self.actor_loss
        self._value_loss_fn = self.value_loss

        m = models.modules
        self.world_model_params = [p for k in WORLD_MODEL_PARTS for p in m[k].parameters()]
        self.actor_params = list(m["actor"].parameters())
        self.value_params = list(m["value"].parameters())
        self.optimizers = {
            "world_model": _adam(self.world_model_params, a.world_model_lr, a.adam_eps),
            "actor": _adam(self.actor_params, a.actor_lr, a.adam_eps),
            "value": _adam(self.value_params, a.value_lr, a.adam_eps),
        }
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

    def _warmup_step(self, prepared: TensorDictBase, latent: TensorDictBase) -> None:
        actor_td, imagined = self._actor_loss_fn(latent.reshape(-1))
        actor_td["loss_actor"].backward()
        value_td, _ = self._value_loss_fn(imagined)
        value_td["loss_value"].backward()

    # -- update ---------------------------------------------------------------
    def _step(self, name: str, loss: torch.Tensor, params: list) -> tuple[torch.Tensor, torch.Tensor]:
        """Backward, gradient sync, clip, step; a non-finite gradient norm skips the
        step on the device. Returns (grad norm, found_inf 0./1.). One range name for
        all three phases, so a trace sums the optimisation work."""
        with record_function("## train/optim ##"):
            opt = self.optimizers[name]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if self.grad_sync is not None:
                self.grad_sync(params)
            grad_norm = clip_grad_norm_(params, self.grad_clip)
            found_inf = (~torch.isfinite(grad_norm)).float()
            opt.found_inf = found_inf  # read by the fused Adam kernel, as GradScaler does
            opt.step()
        return grad_norm, found_inf

    def update(self, batch: TensorDictBase) -> None:
        """One Dreamer update (world model, actor, value) with no host sync."""
        batch = self.prepare(batch)
        with record_function("## train/world_model ##"):
            with self._autocast():
                wm_td, latent = self.world_model_loss(batch)
            wm_loss = wm_td["loss_model_kl"] + wm_td["loss_model_reco"] + wm_td["loss_model_reward"]
        wm_grad, wm_inf = self._step("world_model", wm_loss, self.world_model_params)
        with record_function("## train/actor ##"):
            with self._autocast():
                actor_td, imagined = self._actor_loss_fn(latent.reshape(-1))
            actor_grad, actor_inf = self._step("actor", actor_td["loss_actor"], self.actor_params)
        with record_function("## train/value ##"):
            with self._autocast():
                value_td, _ = self._value_loss_fn(imagined)
            value_grad, value_inf = self._step("value", value_td["loss_value"], self.value_params)
        self.metrics.add(
            torch.stack(
                [
                    wm_td["loss_model_kl"].squeeze(), wm_td["loss_model_reco"].squeeze(),
                    wm_td["loss_model_reward"].squeeze(), actor_td["loss_actor"].squeeze(),
                    value_td["loss_value"].squeeze(), wm_grad, actor_grad, value_grad,
                ]
            )
        )
        self.nonfinite.observe(torch.stack([wm_inf, actor_inf, value_inf]))

"""Dreamer V1 learner: TorchRL's three losses, three optimisers, a sync-free update.

``update(batch)`` never talks to the host: losses and gradient norms are
stacked into one device tensor and summed in :class:`MetricsAccumulator`;
``flush_metrics()`` does the single host transfer, once per log interval.
"""

from __future__ import annotations

import contextlib

import torch
from tensordict import TensorDictBase
from torch.nn.utils import clip_grad_norm_
from torch.profiler import record_function
from torchrl.objectives import DreamerActorLoss, DreamerModelLoss, DreamerValueLoss

from dreamer.compile import maybe_compile, timed_warmup
from dreamer.config import Config
from dreamer.envs import PIXELS_KEY
from dreamer.health import NonFiniteGuard
from dreamer.models import DreamerV1Models
from dreamer.transforms import VectorAsImage

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


class MetricsAccumulator:
    """Running sums of a fixed vector of metrics, kept on the device."""

    def __init__(self, names: tuple[str, ...], device: torch.device):
        self.names = names
        self.total = torch.zeros(len(names), device=device)
        self.count = 0

    def add(self, values: torch.Tensor) -> None:
        self.total.add_(values.detach().float())
        self.count += 1

    def flush(self, extra: dict[str, torch.Tensor] | None = None) -> dict[str, float]:
        """Means since the last flush, plus ``extra`` device scalars in the same
        transfer: the one host sync per log interval."""
        if self.count == 0:
            return {}
        extra = extra or {}
        values = torch.cat([self.total / self.count, *(v.reshape(1).float() for v in extra.values())])
        host = values.tolist()
        self.total.zero_()
        self.count = 0
        return dict(zip(self.names + tuple(extra), host))


def _adam(params, lr: float, eps: float) -> torch.optim.Adam:
    # Fused kernels (CUDA and CPU): only they take a device-side found_inf flag
    # that skips a non-finite step without a host sync (see dreamer.health).
    return torch.optim.Adam(params, lr=lr, eps=eps, fused=True)


class DreamerV1Learner:
    def __init__(
        self,
        cfg: Config,
        models: DreamerV1Models,
        device: torch.device,
        autocast_dtype: torch.dtype | None = None,
    ):
        a = cfg.algo
        self.cfg = cfg
        self.models = models
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.batch_size = cfg.buffer.batch_size
        self.batch_length = cfg.buffer.batch_length
        self.obs_key = models.obs_key
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
        self.metrics = MetricsAccumulator(METRIC_NAMES, device)
        # Data-parallel learners average each phase's gradients across ranks
        # here (dreamer.distributed.GradientAverager); None on one process.
        self.grad_sync = None
        self.nonfinite = NonFiniteGuard(device)
        self._vector_as_image = VectorAsImage()

    # -- data -----------------------------------------------------------------
    def prepare(self, batch: TensorDictBase) -> TensorDictBase:
        """Sampled uint8 steps (B*T) on this device -> the world model's input (B, T)."""
        with record_function("## train/transform ##"):
            batch = batch.reshape(self.batch_size, self.batch_length)
            obs = batch.get(("next", self.obs_key))
            if self.obs_key == PIXELS_KEY:
                # (B, T, 64, 64, 3) uint8 -> (B, T, C, 64, 64) float in [-0.5, 0.5]
                obs = self.models.modules["preprocess"](obs)
            else:
                obs = self._vector_as_image(obs)  # (B, T, D) -> (B, T, 1, 1, D)
            batch.set(("next", self.obs_key), obs)
            if self.cfg.algo.reward_scale != 1.0:
                batch.set(("next", "reward"), batch.get(("next", "reward")) * self.cfg.algo.reward_scale)
            # Each sequence starts from a zero latent, as in Dreamer.
            a = self.cfg.algo
            batch.set("state", torch.zeros(*batch.shape, a.state_dim, device=self.device))
            batch.set("belief", torch.zeros(*batch.shape, a.rssm_hidden_dim, device=self.device))
        return batch

    # -- compile --------------------------------------------------------------
    def compile(self) -> None:
        cc = self.cfg.compile
        self._actor_loss_fn = maybe_compile(self.actor_loss, cc)
        self._value_loss_fn = maybe_compile(self.value_loss, cc)

    def warmup(self, batch: TensorDictBase) -> float:
        """Compile and exercise the (compiled) losses, forward and backward, on a
        real batch before the first update; no optimiser step. Returns seconds."""
        if not self.cfg.compile.enabled:
            return 0.0
        prepared = self.prepare(batch.clone())
        with torch.no_grad(), self._autocast():
            _, latent = self.world_model_loss(prepared)

        def step():
            actor_td, imagined = self._actor_loss_fn(latent.reshape(-1))
            actor_td["loss_actor"].backward()
            value_td, _ = self._value_loss_fn(imagined)
            value_td["loss_value"].backward()

        seconds = timed_warmup(step, self.cfg.compile.warmup_iters)
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=True)
        return seconds

    # -- update ---------------------------------------------------------------
    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

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

    def flush_metrics(self) -> dict[str, float]:
        metrics = self.metrics.flush(self.nonfinite.counts())
        self.nonfinite.reset()
        return metrics

    # -- checkpoint -----------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "modules": self.models.modules.state_dict(),
            "optimizers": {k: o.state_dict() for k, o in self.optimizers.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        self.models.modules.load_state_dict(state["modules"])
        for k, o in self.optimizers.items():
            o.load_state_dict(state["optimizers"][k])

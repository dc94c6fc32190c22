"""Dreamer V3 learner: TorchRL's V3 losses and LaProp/AGC optimiser, a sync-free
update (the contract and shared parts: dreamer/learner_base.py)."""

from __future__ import annotations

from typing import Callable

import torch
from tensordict import TensorDictBase
from torch.nn.utils import get_total_norm
from torch.profiler import record_function
from torchrl.objectives import DreamerV3ActorLoss, DreamerV3ModelLoss, ValueEstimators
from torchrl.objectives.utils import SoftUpdate
from torchrl.trainers.algorithms import DreamerV3Optimizer

from dreamer.config import Config
from dreamer.envs.factory import PIXELS_KEY
from dreamer.errors import UserError
from dreamer.algos.learner import BaseLearner
from dreamer.algos.v3.models import DreamerV3Models
from torchrl_ext import SyncFreeDreamerV3ValueLoss

WORLD_MODEL_LOSSES = (
    "loss_model_dynamic", "loss_model_representation", "loss_model_reco",
    "loss_model_reward", "loss_model_continue",
)
METRIC_NAMES = WORLD_MODEL_LOSSES + (
    "loss_actor", "actor_entropy", "return_scale", "loss_value", "value_slow_loss", "loss_replay_value",
    "grad_norm_world_model", "grad_norm_actor", "grad_norm_value",
)
WORLD_MODEL_PARTS = ("encoder", "decoder", "prior", "posterior", "reward", "continuation")


def _grad_norm(params: list) -> torch.Tensor:
    """Norm of the gradients about to be applied (AGC clips inside the optimiser)."""
    return get_total_norm([p.grad for p in params if p.grad is not None])


def _optimizer_tensors(params: list, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Parameters and the optimiser's state tensors: what a step changes."""
    state = [v for p in params for v in opt.state.get(p, {}).values() if isinstance(v, torch.Tensor)]
    return list(params) + state


def _undo_where(found_inf: torch.Tensor, tensors: list[torch.Tensor], before: list[torch.Tensor]) -> None:
    """Put back ``before`` where ``found_inf`` is 1, on the device (no host sync).

    TorchRL's LaProp/AGC optimiser has no ``found_inf`` input like fused Adam's,
    so a non-finite step is taken and then undone: weights and moments end
    exactly as they were.
    """
    skip = found_inf.bool()
    with torch.no_grad():
        for now, then in zip(tensors, before):
            now.copy_(torch.where(skip, then, now))


def _use_reinforce(actor_grad: str, discrete: bool) -> bool:
    """auto: one-hot samples have no pathwise gradient (REINFORCE); continuous
    actions backpropagate through the learned dynamics."""
    if actor_grad == "dynamics" and discrete:
        raise UserError(
            "algo.actor_grad=dynamics needs continuous actions, and this env's are discrete: "
            "use algo.actor_grad=auto or reinforce"
        )
    return actor_grad == "reinforce" or discrete


class DreamerV3Learner(BaseLearner):
    METRIC_NAMES = METRIC_NAMES

    def __init__(
        self,
        cfg: Config,
        models: DreamerV3Models,
        device: torch.device,
        autocast_dtype: torch.dtype | None = None,
    ):
        super().__init__(cfg, models, device, autocast_dtype)
        a = cfg.algo
        self.world_model_loss = DreamerV3ModelLoss(
            models.world_model,
            kl_mode="separate",  # the paper's dynamics and representation terms
            lambda_dynamic=a.dyn_loss_scale,
            lambda_representation=a.rep_loss_scale,
            free_bits=a.free_bits,
            lambda_continue=1.0,
            # Vectors: squared error in symlog space; pixels: plain squared error.
            reco_symlog=self.obs_key != PIXELS_KEY,
            num_reward_bins=a.num_bins,
        ).to(device)
        self.world_model_loss.set_keys(pixels=self.obs_key, reco_pixels="reco_" + self.obs_key)
        self.actor_loss = DreamerV3ActorLoss(
            models.actor, models.value, models.model_based_env,
            continuation_model=models.continuation,
            imagination_horizon=a.imagination_horizon,
            entropy_bonus=a.entropy_scale,
            use_reinforce=_use_reinforce(a.actor_grad, models.discrete),
            return_normalization_rate=a.return_norm_rate,
            return_normalization_min_scale=a.return_norm_min_scale,
        ).to(device)
        # With a continuation model the loss computes its lambda-returns with
        # an explicit, sync-free recursion over the horizon.
        self.actor_loss.make_value_estimator(ValueEstimators.TDLambda, gamma=a.gamma, lmbda=a.lmbda)
        self.value_loss = SyncFreeDreamerV3ValueLoss(
            models.value, value_loss="two_hot", num_value_bins=a.num_bins,
            actor_loss=self.actor_loss, slow_critic_regularization=a.slow_critic_reg,
        ).to(device)
        # The slow critic exists only when it regularises (slow_critic_reg > 0).
        self.slow_critic = (
            SoftUpdate(self.value_loss, tau=a.slow_critic_tau) if a.slow_critic_reg > 0 else None
        )
        self._actor_loss_fn = self.actor_loss
        self._value_loss_fn = self.value_loss
        self._replay_value_fn = self.value_loss.replay_value_loss

        m = models.modules
        self.params = {
            "world_model": [p for k in WORLD_MODEL_PARTS for p in m[k].parameters()],
            "actor": list(m["actor"].parameters()),
            "value": list(m["value"].parameters()),
        }
        lrs = {"world_model": a.world_model_lr, "actor": a.actor_lr, "value": a.value_lr}
        self.optimizers = {
            name: DreamerV3Optimizer(
                params, lr=lrs[name], agc=a.agc, eps=a.adam_eps, warmup_steps=a.lr_warmup_steps
            )
            for name, params in self.params.items()
        }

    # -- data -----------------------------------------------------------------
    def _prepare_inputs(self, batch: TensorDictBase) -> TensorDictBase:
        if self.obs_key == PIXELS_KEY:
            # (B, T, 64, 64, 3) uint8 -> (B, T, C, 64, 64) float in [0, 1]
            obs = self.models.modules["preprocess"](batch.get(("next", self.obs_key)))
            batch.set(("next", self.obs_key), obs)
        # Replay holds env actions; the world model learns on the actor's [-1, 1].
        batch.set("action", self.models.to_unit_actions(batch.get("action").float()))
        return batch

    @staticmethod
    def _start_states(latent: TensorDictBase) -> TensorDictBase:
        """Every posterior (B, T) -> (B*T,) imagination start states."""
        return latent.get("next").select("state", "belief").reshape(-1)

    # -- compile --------------------------------------------------------------
    def _compilable(self) -> dict[str, Callable]:
        return {**super()._compilable(), "_replay_value_fn": self.value_loss.replay_value_loss}

    def warmup(self, batch: TensorDictBase) -> float:
        # The warm-up must not move the return-normalisation statistics.
        retnorm = {k: v.clone() for k, v in self.actor_loss.retnorm.state_dict().items()}
        seconds = super().warmup(batch)
        self.actor_loss.retnorm.load_state_dict(retnorm)
        return seconds

    def _warmup_step(self, prepared: TensorDictBase, latent: TensorDictBase) -> None:
        actor_td, imagined = self._actor_loss_fn(self._start_states(latent))
        actor_td["loss_actor"].backward()
        self._critic_loss(prepared, latent, imagined)[0].backward()

    # -- update ---------------------------------------------------------------
    def _step(self, name: str, loss: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Backward and step; a non-finite gradient norm undoes the step on the device.
        Returns (grad norm, found_inf 0./1.). One range name for all three phases,
        so a trace sums the optimisation work (as V1's)."""
        with record_function("## train/optim ##"):
            opt, params = self.optimizers[name], self.params[name]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if self.grad_sync is not None:
                self.grad_sync(params)
            grad_norm = _grad_norm(params)
            found_inf = (~torch.isfinite(grad_norm)).float()
            tensors = _optimizer_tensors(params, opt)
            before = list(torch._foreach_mul(tensors, 1.0))  # copies, one kernel per group
            opt.step()
            after = _optimizer_tensors(params, opt)
            # State the first step created had no "before": a skipped first step leaves it at zero.
            created = after[len(before):]
            _undo_where(found_inf, after[: len(before)] + created, before + [torch.zeros_like(t) for t in created])
        return grad_norm, found_inf

    def _replay_value_loss(self, batch: TensorDictBase, latent: TensorDictBase,
                           imagined: TensorDictBase) -> torch.Tensor:
        """The critic on replayed sequences: lambda-returns along the real rewards,
        bootstrapped from each state's own imagined return (the paper's repval).
        Features are detached: the world model learns from its own loss only."""
        replay = latent.get("next").select("state", "belief").detach()  # (B, T, S), (B, T, H)
        # lambda_target (B*T, H, 1): step 0 is the return imagined from that replay state.
        bootstrap = imagined.get("lambda_target")[:, 0, 0].reshape(replay.shape)  # (B, T)
        replay.set("bootstrap", bootstrap)
        for key in ("reward", "done", "terminated"):
            replay.set(("next", key), batch.get(("next", key)))  # (B, T, 1)
        a = self.cfg.algo
        loss_td = self._replay_value_fn(replay, horizon=1.0 / (1.0 - a.gamma), lmbda=a.lmbda)
        return loss_td["loss_replay_value"]

    def _critic_loss(self, batch: TensorDictBase, latent: TensorDictBase,
                     imagined: TensorDictBase) -> tuple[torch.Tensor, TensorDictBase, torch.Tensor]:
        """Imagined value loss plus the weighted replay loss; returns (total, parts, replay)."""
        value_td, _ = self._value_loss_fn(imagined)
        scale = self.cfg.algo.replay_value_scale
        if scale == 0:
            replay = torch.zeros((), device=self.device)
            return value_td["loss_value"], value_td, replay
        replay = self._replay_value_loss(batch, latent, imagined)
        return value_td["loss_value"] + scale * replay, value_td, replay

    def update(self, batch: TensorDictBase) -> None:
        """One Dreamer V3 update (world model, actor, value, slow critic) with no host sync."""
        batch = self.prepare(batch)
        with record_function("## train/world_model ##"):
            with self._autocast():
                wm_td, latent = self.world_model_loss(batch)
            wm_losses = [wm_td[k].squeeze() for k in WORLD_MODEL_LOSSES]
        wm_grad, wm_inf = self._step("world_model", sum(wm_losses))
        with record_function("## train/actor ##"):
            with self._autocast():
                actor_td, imagined = self._actor_loss_fn(self._start_states(latent))
            actor_grad, actor_inf = self._step("actor", actor_td["loss_actor"])
        with record_function("## train/value ##"):
            with self._autocast():
                critic_loss, value_td, replay_value = self._critic_loss(batch, latent, imagined)
            value_grad, value_inf = self._step("value", critic_loss)
            if self.slow_critic is not None:
                self.slow_critic.step()
        self.nonfinite.observe(torch.stack([wm_inf, actor_inf, value_inf]))
        self.metrics.add(
            torch.stack(
                wm_losses + [
                    actor_td["loss_actor"], actor_td["actor_entropy"], actor_td["return_scale"],
                    value_td["loss_value"], value_td["value_slow_loss"], replay_value,
                    wm_grad, actor_grad, value_grad,
                ]
            )
        )

    # -- checkpoint -----------------------------------------------------------
    def _extra_state(self) -> dict:
        # Return-normalisation percentiles and the slow critic's weights.
        return {"return_norm": self.actor_loss.retnorm.state_dict(), "value_loss": self.value_loss.state_dict()}

    def _load_extra_state(self, state: dict) -> None:
        self.actor_loss.retnorm.load_state_dict(state["return_norm"])
        self.value_loss.load_state_dict(state["value_loss"])

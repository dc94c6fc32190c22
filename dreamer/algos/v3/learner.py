"""Dreamer V3 learner: TorchRL's V3 losses and LaProp/AGC optimiser (skipping
non-finite steps on the device) (the skeleton: dreamer/algos/learner.py).

The losses and their scales are the reference's (danijar/dreamerv3's
``loss_scales``): the world model's dynamics and representation KL (between
1%-unimixed categoricals), reconstruction, reward and continue terms, the actor's,
the critic's on imagined returns and on replayed sequences (repval); by default
in the reference's order, one backward of their sum (``algo.joint_update``), where
the replay-value loss also trains the world model (``algo.repval_grad``)."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torchrl.objectives import DreamerV3ModelLoss, ValueEstimators

from dreamer.algos.learner import BaseLearner, PhaseOut, param_groups
from dreamer.algos.nonfinite import SkipInStep
from dreamer.algos.v3.models import DreamerV3Models
from dreamer.config import CompileConfig, DreamerV3Config
from dreamer.envs.keys import PIXELS_KEY
from dreamer.errors import UserError
from dreamer.system.compile import rssm_step_compile_kwargs
from torchrl_ext import (
    OneCriticPassDreamerV3ActorLoss,
    SkippableDreamerV3Optimizer,
    SkippableSoftUpdate,
    SyncFreeDreamerV3ValueLoss,
    held_out_view,
)

WORLD_MODEL_LOSSES = (
    "loss_model_dynamic", "loss_model_representation", "loss_model_reco",
    "loss_model_reward", "loss_model_continue",
)
METRIC_NAMES = WORLD_MODEL_LOSSES + (
    "loss_actor", "actor_entropy", "return_scale", "loss_value", "value_slow_loss", "loss_replay_value",
    "grad_norm_world_model", "grad_norm_actor", "grad_norm_value",
)
WORLD_MODEL_PARTS = ("encoder", "decoder", "prior", "posterior", "reward", "continuation")


def _use_reinforce(actor_grad: str, discrete: bool) -> bool:
    """auto: one-hot samples have no pathwise gradient (REINFORCE); continuous
    actions backpropagate through the learned dynamics."""
    if actor_grad == "dynamics" and discrete:
        raise UserError(
            "algo.actor_grad=dynamics needs continuous actions, and this env's are discrete: "
            "use algo.actor_grad=auto or reinforce"
        )
    return actor_grad == "reinforce" or discrete


def _world_model_loss(a: DreamerV3Config, models: DreamerV3Models, device: torch.device, *,
                      keep_graph: bool) -> DreamerV3ModelLoss:
    """TorchRL's V3 world-model loss with every term unscaled (every lambda 1, the continue
    term on: the learner weighs them); ``keep_graph``: its posteriors keep their graph (the
    replay-value loss then trains the world model)."""
    loss = DreamerV3ModelLoss(
        models.world_model,
        kl_mode="separate",  # the paper's dynamics and representation terms
        lambda_dynamic=1.0,
        lambda_representation=1.0,
        free_bits=a.free_bits,
        unimix=a.unimix,  # the KL between 1%-unimixed distributions, as the reference takes it
        lambda_continue=1.0,
        # Vectors: squared error in symlog space; pixels: plain squared error.
        reco_symlog=models.obs_key != PIXELS_KEY,
        num_reward_bins=a.num_bins,
        detach_output=not keep_graph,
    ).to(device)
    loss.set_keys(pixels=models.obs_key, reco_pixels="reco_" + models.obs_key)
    return loss


class DreamerV3Learner(BaseLearner):
    METRIC_NAMES = METRIC_NAMES

    @classmethod
    def refuse_env(cls, algo_cfg: DreamerV3Config, discrete_actions: bool) -> None:
        _use_reinforce(algo_cfg.actor_grad, discrete_actions)

    def __init__(
        self,
        algo_cfg: DreamerV3Config,
        compile_cfg: CompileConfig,
        models: DreamerV3Models,
        device: torch.device,
        *,
        batch_size: int,
        batch_length: int,
        autocast_dtype: torch.dtype | None = None,
    ):
        a = algo_cfg
        reinforce = _use_reinforce(a.actor_grad, models.discrete)
        # A REINFORCE actor loss differentiates nothing through the imagined
        # trajectory: the rollout need not record autograd (same values).
        models.model_based_env.rollout_gradients = not reinforce
        self.repval_grad = a.repval_grad and a.replay_value_scale > 0
        self.world_model_loss = _world_model_loss(a, models, device, keep_graph=self.repval_grad)
        # REINFORCE: one critic pass over the imagined states serves the returns,
        # the baseline and the value loss (upstream's loss makes three).
        self.actor_loss = OneCriticPassDreamerV3ActorLoss(
            # The REINFORCE loss's one critic pass trains the critic (the value loss reads
            # its logits); a pathwise loss's bootstraps must not: a held-out view.
            models.actor, models.value if reinforce else held_out_view(models.value), models.model_based_env,
            continuation_model=models.continuation,
            imagination_horizon=a.imagination_horizon,
            entropy_bonus=a.entropy_scale,
            use_reinforce=reinforce,
            return_normalization_rate=a.return_norm_rate,
            return_normalization_min_scale=a.return_norm_min_scale,
        )
        # With a continuation model the loss computes its lambda-returns with
        # an explicit, sync-free recursion over the horizon. Made before the move
        # to the device: the estimator's gamma is a CPU buffer otherwise, copied to
        # the GPU (a host sync) in every update.
        self.actor_loss.make_value_estimator(ValueEstimators.TDLambda, gamma=a.gamma, lmbda=a.lmbda)
        self.actor_loss.to(device)
        # The running statistics an update skipped as non-finite puts back (_statistics).
        self._return_norm_names = tuple(self.actor_loss.retnorm.state_dict(keep_vars=True))
        self.value_loss = SyncFreeDreamerV3ValueLoss(
            models.value, value_loss="two_hot", num_value_bins=a.num_bins,
            actor_loss=self.actor_loss, slow_critic_regularization=a.slow_critic_reg,
        ).to(device)
        # The slow critic exists only when it regularises (slow_critic_reg > 0).
        self.slow_critic = (
            SkippableSoftUpdate(self.value_loss, tau=a.slow_critic_tau) if a.slow_critic_reg > 0 else None
        )

        params = param_groups(models.modules, WORLD_MODEL_PARTS)
        lrs = {"world_model": a.world_model_lr, "actor": a.actor_lr, "value": a.value_lr}
        super().__init__(
            algo_cfg, compile_cfg, models, device,
            batch_size=batch_size, batch_length=batch_length, autocast_dtype=autocast_dtype,
            params=params,
            loss_scales={
                "loss_model_dynamic": a.dyn_loss_scale, "loss_model_representation": a.rep_loss_scale,
                "loss_model_reco": 1.0, "loss_model_reward": 1.0, "loss_model_continue": 1.0,
                "loss_actor": 1.0, "loss_value": 1.0, "loss_replay_value": a.replay_value_scale,
            },
            optimizers={
                name: SkippableDreamerV3Optimizer(
                    p, lr=lrs[name], agc=a.agc, eps=a.adam_eps, warmup_steps=a.lr_warmup_steps
                )
                for name, p in params.items()
            },
            # The LaProp step reads found_inf and skips on the device.
            nonfinite_policy=SkipInStep(),
            grad_clip=None,  # AGC clips inside the optimiser
            compilable={
                "actor": self.actor_loss, "value": self.value_loss,
                "replay_value": self.value_loss.replay_value_loss,
            },
            joint_update=a.joint_update,
        )

    # -- data -----------------------------------------------------------------
    def _prepare_inputs(self, batch: TensorDictBase) -> TensorDictBase:
        if self.obs_key == PIXELS_KEY:
            # (B, T, 64, 64, 3) uint8 -> (B, T, C, 64, 64) float in [0, 1]
            obs = self.models.modules["preprocess"](batch.get(("next", self.obs_key)))
            batch.set(("next", self.obs_key), obs)
        # Replay holds env actions; the world model learns on the actor's [-1, 1].
        batch.set("action", self.models.to_unit_actions(batch.get("action").float()))
        return batch

    # -- compile --------------------------------------------------------------
    def compile_losses(self, compile_fn) -> None:
        """The losses, and one RSSM step of the world model (compile.rssm_step):
        the loop over time stays eager and calls the compiled step."""
        super().compile_losses(compile_fn)
        cc = self.compile_cfg
        if cc.enabled and cc.rssm_step:
            self.models.rollout.compile_rollout("step", **rssm_step_compile_kwargs(cc))

    def _statistics(self) -> list[torch.Tensor]:
        # The buffers ``state_dict`` saves, by the names read from it at construction: torch
        # 2.11's dynamo cannot trace ``state_dict`` (it sets ``_metadata`` on an OrderedDict).
        buffers = dict(self.actor_loss.retnorm.named_buffers())
        return [buffers[name] for name in self._return_norm_names]

    # -- the phases -------------------------------------------------------------
    def _world_model_phase(self, batch: TensorDictBase) -> PhaseOut:
        wm_td, latent = self.world_model_loss(batch)  # latent: (B, T) posterior states
        return PhaseOut({k: wm_td[k].squeeze() for k in WORLD_MODEL_LOSSES}, {}, latent)

    def _actor_phase(self, latent: TensorDictBase) -> PhaseOut:
        actor_td, imagined = self.loss_fns["actor"](self.imagination_starts(latent))
        metrics = {"actor_entropy": actor_td["actor_entropy"], "return_scale": actor_td["return_scale"]}
        return PhaseOut({"loss_actor": actor_td["loss_actor"]}, metrics, imagined)

    def _value_phase(self, batch: TensorDictBase, latent: TensorDictBase, imagined: TensorDictBase) -> PhaseOut:
        """The critic's loss on imagined returns and on replayed sequences."""
        value_td, _ = self.loss_fns["value"](imagined)
        if self.algo_cfg.replay_value_scale == 0:
            replay = torch.zeros((), device=self.device)
        else:
            replay = self._replay_value_loss(batch, latent, imagined)
        losses = {"loss_value": value_td["loss_value"], "loss_replay_value": replay}
        return PhaseOut(losses, {"value_slow_loss": value_td["value_slow_loss"]})

    def _replay_value_loss(self, batch: TensorDictBase, latent: TensorDictBase,
                           imagined: TensorDictBase) -> torch.Tensor:
        """The critic on replayed sequences: lambda-returns along the real rewards,
        bootstrapped from each state's own imagined return (the paper's repval).
        With ``algo.repval_grad`` its gradient reaches the world model through the
        posterior features, as the reference's does; otherwise they are detached."""
        replay = latent.get("next").select("state", "belief")  # (B, T, S), (B, T, H)
        if not self.repval_grad:
            replay = replay.detach()
        # lambda_target (B*T, H, 1): step 0 is the return imagined from that replay state.
        bootstrap = imagined.get("lambda_target")[:, 0, 0].reshape(replay.shape)  # (B, T)
        replay.set("bootstrap", bootstrap)
        for key in ("reward", "done", "terminated"):
            replay.set(("next", key), batch.get(("next", key)))  # (B, T, 1)
        a = self.algo_cfg
        loss_td = self.loss_fns["replay_value"](replay, horizon=1.0 / (1.0 - a.gamma), lmbda=a.lmbda)
        return loss_td["loss_replay_value"]

    def _after_value_step(self, skipped: torch.Tensor) -> None:
        if self.slow_critic is not None:
            self.slow_critic.step(skipped)  # a skipped update leaves it where it was

    # -- checkpoint -----------------------------------------------------------
    def _extra_state(self) -> dict:
        # Return-normalisation percentiles and the slow critic's weights.
        return {"return_norm": self.actor_loss.retnorm.state_dict(), "value_loss": self.value_loss.state_dict()}

    def _load_extra_state(self, state: dict) -> None:
        self.actor_loss.retnorm.load_state_dict(state["return_norm"])
        self.value_loss.load_state_dict(state["value_loss"])

"""TorchRL's DreamerV3 actor and value losses, with fewer critic passes and no host sync.

``DreamerV3ValueLoss.replay_value_loss`` (torchrl 0.14.1) computes its
lambda-returns with the vectorised estimator whenever it is not being compiled,
and that estimator calls ``.item()`` on gamma * lambda (``_geom_series_like``):
on CUDA a host-device sync in every eager update. The sequential estimator,
which upstream already uses under ``torch.compile``, needs no host value and
gives the same numbers; :class:`SyncFreeDreamerV3ValueLoss` uses it in eager
mode too.

A REINFORCE update of upstream's losses runs the critic three times over the
same detached imagined states: over steps 1..H for the returns' bootstraps and
over 0..H-1 for the baseline (the actor loss, both without gradient), and over
0..H-1 again with gradient (the value loss). :class:`OneCriticPassDreamerV3ActorLoss`
runs it once, over 0..H, and hands the value loss its logits.

Upstream's value loss runs its critic inside ``TensorDictParams.to_module``
(swap the weights in, run, swap them back) on every call. Under
``torch.compile`` that swap's bookkeeping (a ``deque`` of operations kept on
the parameters' tensordict) is a side effect dynamo rebuilds wrongly after a
traced backward ("TypeError: an integer is required" from ``deque(maxlen=...)``),
so a whole update (losses, backward, optimiser steps) could not be one graph.
:class:`SyncFreeDreamerV3ValueLoss` calls its critic directly where its
parameters are the module's own (as a loss built on a module has them), and its
slow critic through a copy of the critic whose tensors share storage with the
target parameters (made once, when the loss is built or moved).
"""

from __future__ import annotations

import copy
import warnings

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules.distributions.utils import has_analytic_entropy, rsample_and_log_prob
from torchrl.modules.models.model_based import two_hot_encode
from torchrl.objectives import DreamerV3ActorLoss, DreamerV3ValueLoss
from torchrl.objectives.dreamer_v3 import _match_trailing_dim
from torchrl.objectives.value.functional import td_lambda_return_estimate

from torchrl_ext.value_norm import TraceablePercentileValueNorm

# The critic's logits over imagined steps 0..H-1, with their graph to the
# critic's weights: written by the actor loss, read by the value loss.
CRITIC_LOGITS_KEY = "_critic_logits"


@torch.no_grad()
def replay_lambda_returns(
    reward: torch.Tensor,  # (..., T, 1) reward received on entering step k
    done: torch.Tensor,  # (..., T, 1) bool
    terminated: torch.Tensor,  # (..., T, 1) bool
    bootstrap: torch.Tensor,  # (..., T) value estimate of each state
    horizon: float,
    lmbda: float,
) -> torch.Tensor:
    """Lambda-returns along a replayed sequence, one step shorter than it:
    element k is the return of state k, from reward and bootstrap k + 1 on. (..., T-1)"""
    return td_lambda_return_estimate(
        gamma=1.0 - 1.0 / horizon,
        lmbda=lmbda,
        next_state_value=bootstrap.unsqueeze(-1)[..., 1:, :],
        reward=reward[..., 1:, :],
        done=done[..., 1:, :],
        terminated=terminated[..., 1:, :],
    ).squeeze(-1)


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.data_ptr(), a.shape, a.stride(), a.dtype) == (b.data_ptr(), b.shape, b.stride(), b.dtype)


class OneCriticPassDreamerV3ActorLoss(DreamerV3ActorLoss):
    """:class:`~torchrl.objectives.DreamerV3ActorLoss` whose REINFORCE path runs
    the critic and the continuation model once each, over imagined steps 0..H.

    The bootstraps (steps 1..H) and the baseline (0..H-1) are that pass's values,
    detached; its logits over 0..H-1 stay attached to the critic's weights under
    ``CRITIC_LOGITS_KEY`` in the returned rollout, where
    :class:`SyncFreeDreamerV3ValueLoss` takes them instead of a pass of its own.
    The imagined states carry no gradient (a REINFORCE rollout), so the values are
    the ones upstream's three passes compute. The pathwise (dynamics) loss
    differentiates the bootstraps through the imagined states, which the value loss
    must not do: it keeps upstream's path.

    ``value_logits_key`` names the critic's logits output (the value loss's
    ``value_logits`` key); every other argument is upstream's. The return scale's
    quantiles are taken in traceable ops (torchrl_ext/value_norm.py).
    """

    def __init__(self, *args, value_logits_key: NestedKey = "state_value_logits", **kwargs):
        super().__init__(*args, **kwargs)
        self.value_logits_key = value_logits_key
        self.retnorm = TraceablePercentileValueNorm.like(self.retnorm)

    def forward(self, tensordict: TensorDictBase) -> tuple[TensorDict, TensorDict]:
        if not self.use_reinforce:
            return super().forward(tensordict)
        keys = self.tensor_keys
        start = tensordict.select(keys.state, keys.belief).data
        # Nothing differentiates through a REINFORCE rollout, so it runs without autograd
        # instead of inside ``hold_out_net``: the same values, and under torch.compile no
        # swap of every world-model weight for a detached copy and back to trace.
        with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
            start = self.model_based_env.reset(start.copy())
            imagined = self.model_based_env.rollout(
                max_steps=self.imagination_horizon, policy=self.actor_model, auto_reset=False,
                tensordict=start, break_when_any_done=False,
            )  # (N, H): steps 0..H-1 at the root, 1..H under "next"
        time_dim = imagined.ndim - 1
        states = torch.cat(
            [imagined.select(keys.state, keys.belief),
             imagined.get("next").select(keys.state, keys.belief)[..., -1:]],
            dim=time_dim,
        ).detach()  # (N, H + 1): steps 0..H
        critic = self.value_model(states.copy())  # gradient to the critic's weights only
        value = critic.get(keys.value).detach()
        next_value, baseline = value[..., 1:, :], value[..., :-1, :]
        logits = critic.get(self.value_logits_key, None)  # none: a scalar (symlog) critic
        if logits is not None:
            imagined.set(CRITIC_LOGITS_KEY, logits[..., :-1, :])

        reward = imagined.get(("next", keys.reward))
        continuation = root_continuation = None
        continuation_model = self.__dict__.get("continuation_model")
        if continuation_model is not None:
            with torch.no_grad():  # weights the returns and the discount, both stopped
                continues = continuation_model(states.copy()).get(keys.continuation)
            continuation, root_continuation = continues[..., 1:, :], continues[..., :-1, :]
            imagined.set(keys.continuation, root_continuation)
            imagined.set(("next", keys.continuation), continuation)
        lambda_target = self.lambda_target(reward, next_value, continuation)
        imagined.set("lambda_target", lambda_target)

        if self.discount_loss:
            gamma = self.value_estimator.gamma.to(lambda_target.device)
            # w_t uses the root continuations (0..H-1), the returns use 1..H.
            weights = root_continuation if continuation is not None else torch.ones_like(lambda_target)
            discount = torch.cat([weights[..., :1, :], gamma * weights[..., 1:, :]], dim=-2).cumprod(dim=-2)
        else:
            discount = torch.ones_like(lambda_target)
        discount = discount.detach()
        imagined.set(keys.discount_weight, discount)

        # Score a stopped action from a stopped imagined state.
        policy = self.actor_model.get_dist(imagined.select(*self.actor_model.in_keys, strict=False).detach())
        log_prob = _match_trailing_dim(policy.log_prob(imagined.get(keys.action).detach()), lambda_target)
        return_scale = self._return_scale(lambda_target)
        advantage = (lambda_target - baseline).detach() / return_scale
        actor_loss = -(discount * log_prob * advantage).mean()
        if self.entropy_bonus > 0:
            if has_analytic_entropy(policy):
                entropy = policy.entropy()
            else:
                entropy = -rsample_and_log_prob(policy)[1]
            entropy = (discount * _match_trailing_dim(entropy, discount)).mean()
            actor_loss = actor_loss - self.entropy_bonus * entropy
        else:
            entropy = actor_loss.new_zeros(())
        losses = TensorDict(
            {
                "loss_actor": actor_loss,
                "actor_entropy": entropy.detach(),
                "return_low": self.return_low.detach().clone(),
                "return_high": self.return_high.detach().clone(),
                "return_scale": return_scale.detach().clone(),
                "continuation_mean": (
                    continuation.mean().detach() if continuation is not None
                    else torch.ones((), device=actor_loss.device)
                ),
            },
            [],
        )
        self._clear_weakrefs(tensordict, losses)
        return losses, imagined


class SyncFreeDreamerV3ValueLoss(DreamerV3ValueLoss):
    """:class:`~torchrl.objectives.DreamerV3ValueLoss` whose replay-value loss
    never reads a tensor on the host (same arguments, same result), whose
    imagined-value loss takes the critic's logits from the rollout when
    :class:`OneCriticPassDreamerV3ActorLoss` left them there, and whose critics
    run without swapping weights (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._bind_critics()

    def _apply(self, fn, *args, **kwargs):
        # ``.to(device)`` may give the targets new storage: bind the slow critic to it again.
        out = super()._apply(fn, *args, **kwargs)
        if "_own_critic_params" in self.__dict__:
            self._bind_critics()
        return out

    def _bind_critics(self) -> None:
        own = TensorDict.from_module(self.value_model).flatten_keys()
        params = self.value_model_params.flatten_keys()
        # The module's own tensors (buffers may be held as other tensors over the same memory).
        self.__dict__["_own_critic_params"] = set(own.keys()) == set(params.keys()) and all(
            params[key] is own[key] or _same_memory(params[key], own[key]) for key in params.keys()
        )
        slow = None
        if self.slow_critic_regularization:
            slow = copy.deepcopy(self.value_model)
            with warnings.catch_warnings():
                # Read while the loss is built: its updater (a SoftUpdate) can only be made after.
                warnings.filterwarnings("ignore", message="No target network updater")
                targets = self.target_value_model_params
            targets.to_module(slow)  # shares the targets' storage
            slow.requires_grad_(False)
        self.__dict__["_slow_value_model"] = slow  # not a submodule: the targets are its state

    def _critic(self, features: TensorDictBase) -> TensorDictBase:
        """The critic on ``features`` (written into it), with the trained weights."""
        if self._own_critic_params:
            return self.value_model(features)
        with self.value_model_params.to_module(self.value_model, preserve_module_state=False):
            return self.value_model(features)

    def forward(self, imagined: TensorDictBase) -> tuple[TensorDict, TensorDict]:
        keys = self.tensor_keys
        discount = imagined.get(keys.discount_weight, None)
        if self.value_loss != "two_hot" or discount is None:
            return super().forward(imagined)
        logits = imagined.get(CRITIC_LOGITS_KEY, None)
        if logits is None:  # no critic pass in the actor loss (a pathwise actor): one here
            logits = self._critic(imagined.select(*self.value_model.in_keys, strict=False)).get(keys.value_logits)
        target = imagined.get("lambda_target").squeeze(-1)
        discount = discount.squeeze(-1)
        if self.slow_critic_regularization:
            slow_target = self._slow_critic_values(imagined).squeeze(-1)
            loss, slow_loss = self._step_value_losses(logits, target, slow_target)
            loss = loss + self.slow_critic_regularization * slow_loss
        else:
            (loss,) = self._step_value_losses(logits, target)
            slow_loss = torch.zeros_like(loss)
        losses = TensorDict(
            loss_value=self._reduce_loss(discount * loss),
            value_slow_loss=self._reduce_loss(discount * slow_loss).detach(),
        )
        return losses, imagined.exclude(CRITIC_LOGITS_KEY).data

    def replay_value_loss(
        self, tensordict: TensorDictBase, *, horizon: float = 333.0, lmbda: float = 0.95
    ) -> TensorDictBase:
        keys = self.tensor_keys
        done = tensordict.get(("next", keys.done))
        target = replay_lambda_returns(
            tensordict.get(("next", keys.reward)), done, tensordict.get(("next", keys.terminated)),
            tensordict.get(keys.bootstrap), horizon, lmbda,
        )
        # The last step has no successor; a step that ends its episode has no return.
        weight = ~done.squeeze(-1)[..., :-1]

        features = self._critic(tensordict.select(*self.value_model.in_keys, strict=False))
        if self.value_loss == "two_hot":
            prediction = features.get(keys.value_logits)[..., :-1, :]
        else:
            prediction = features.get(keys.value)[..., :-1, 0]
        if self.slow_critic_regularization:
            slow_target = self._slow_critic_values(tensordict)[..., :-1, 0]
            loss, slow_loss = self._step_value_losses(prediction, target, slow_target)
            loss = loss + self.slow_critic_regularization * slow_loss
        else:
            (loss,) = self._step_value_losses(prediction, target)
        return TensorDict(loss_replay_value=self._reduce_loss(weight.to(loss.dtype) * loss))

    @torch.no_grad()
    def _slow_critic_values(self, tensordict: TensorDictBase) -> torch.Tensor:
        """The slow critic's values of ``tensordict``'s states."""
        slow = tensordict.select(*self.value_model.in_keys, strict=False)
        return self._slow_value_model(slow).get(self.tensor_keys.value)

    def _step_value_losses(self, prediction: torch.Tensor, *targets: torch.Tensor) -> list[torch.Tensor]:
        """``_step_value_loss(prediction, target)`` for each target; two-hot logits are
        normalised once for all of them (the same ops as upstream's, so the same numbers)."""
        if self.value_loss != "two_hot":
            return [self._step_value_loss(prediction, target) for target in targets]
        log_probs = torch.log_softmax(prediction, dim=-1)
        return [-(two_hot_encode(target, self.value_bins) * log_probs).sum(-1) for target in targets]


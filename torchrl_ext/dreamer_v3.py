"""A sync-free replay-value loss for TorchRL's DreamerV3 critic.

``DreamerV3ValueLoss.replay_value_loss`` (torchrl 0.14.1) computes its
lambda-returns with the vectorised estimator whenever it is not being compiled,
and that estimator calls ``.item()`` on gamma * lambda (``_geom_series_like``):
on CUDA a host-device sync in every eager update. The sequential estimator,
which upstream already uses under ``torch.compile``, needs no host value and
gives the same numbers; this subclass uses it in eager mode too.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.objectives import DreamerV3ValueLoss
from torchrl.objectives.value.functional import td_lambda_return_estimate


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


class SyncFreeDreamerV3ValueLoss(DreamerV3ValueLoss):
    """:class:`~torchrl.objectives.DreamerV3ValueLoss` whose replay-value loss
    never reads a tensor on the host (same arguments, same result)."""

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

        features = tensordict.select(*self.value_model.in_keys, strict=False)
        with self.value_model_params.to_module(self.value_model, preserve_module_state=False):
            self.value_model(features)
        if self.value_loss == "two_hot":
            prediction = features.get(keys.value_logits)[..., :-1, :]
        else:
            prediction = features.get(keys.value)[..., :-1, 0]
        loss = self._step_value_loss(prediction, target)

        if self.slow_critic_regularization:
            slow = tensordict.select(*self.value_model.in_keys, strict=False)
            with torch.no_grad(), self.target_value_model_params.to_module(
                self.value_model, preserve_module_state=False
            ):
                self.value_model(slow)
            slow_target = slow.get(keys.value)[..., :-1, 0]
            loss = loss + self.slow_critic_regularization * self._step_value_loss(prediction, slow_target)
        return TensorDict(loss_replay_value=self._reduce_loss(weight.to(loss.dtype) * loss))

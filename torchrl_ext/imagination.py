"""Imagination: Dreamer model envs and a tanh-normal actor distribution that
never test tensor values in Python, and a fixed-horizon rollout without
``EnvBase.step``'s per-step bookkeeping.

On CUDA, ``if tensor:`` copies the tensor to the host and waits for the GPU;
under ``torch.compile`` it is also a graph break. Two such tests ran inside every
Dreamer actor update upstream:

- ``EnvBase.rollout`` stops early when any env is done, so it tests ``done`` after
  every imagined step (and ``maybe_reset`` once before the first). A Dreamer V1
  model env never produces a done state, so imagined rollouts need no test.
- ``TanhNormal.__init__`` validates its bounds, ``(high > low).all()``, and tests
  ``(high != 1).any()`` to decide whether to rescale, each time a distribution is
  built: once per imagined step. With fixed bounds both are known when the
  policy is built.

A discrete actor's ``OneHotCategorical.sample`` is wrapped by an instance of
``_one_hot_wrapper`` held in a closure, which dynamo cannot build a variable for
("SourcelessBuilder.create does not know how to wrap _one_hot_wrapper"). Inside
the imagination's exploration-type context the break cannot be resumed, so
dynamo ran the whole imagination frame eagerly and compiled the tensordict calls
inside it one by one instead; guarding on each call's key (``key == 'done'``) they
reached dynamo's recompile limit. :class:`TraceableOneHotCategorical` samples
with the same draws in plain code.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from torch import distributions as D
from torchrl.modules import OneHotCategorical, TanhNormal
from torchrl.modules.distributions.continuous import (
    SafeTanhTransform,
    _PatchedAffineTransform,
    _PatchedComposeTransform,
)

from torchrl_ext.fixed_specs import FixedSpecsDreamerEnv


class NonTerminatingDreamerEnv(FixedSpecsDreamerEnv):
    """A :class:`~torchrl.envs.DreamerEnv` whose rollouts never test for done.

    ``rollout`` defaults to ``break_when_any_done=False`` (callers may still ask
    for early stopping) and ``maybe_reset`` returns its input: the world model
    predicts no terminations, so no imagined state is ever done.
    """

    def rollout(self, *args, break_when_any_done: bool | None = False, **kwargs):
        return super().rollout(*args, break_when_any_done=break_when_any_done, **kwargs)

    def maybe_reset(self, tensordict):
        return tensordict


class BatchedRewardDreamerEnv(FixedSpecsDreamerEnv):
    """A :class:`~torchrl.envs.DreamerEnv` whose fixed-horizon rollouts step only
    the transition model and score rewards once, over the whole imagined block.

    The reward model reads (state, belief) only, so nothing inside the loop
    needs it: one call over ``[*batch, horizon]`` replaces ``horizon`` small
    ones. The loop also skips ``EnvBase.step``'s per-step bookkeeping (spec
    checks, ``step_mdp``, a clone and a select of the step's tensordict), which
    at imagination sizes costs about as much as the networks. The output is
    the tensordict ``EnvBase.rollout`` returns: the same keys, shapes, values
    and random draws (the policy, then the transition, per step), the done
    flags all False, as a model env without a done model gives.

    The fast path takes the call Dreamer's actor losses make (a policy, a start
    tensordict, ``auto_reset=False``, ``break_when_any_done=False``); any other
    call runs upstream's rollout. ``world_model`` must be a
    :class:`~torchrl.modules.WorldModelWrapper` (transition, then reward).
    """

    def rollout(self, max_steps: int, policy=None, callback=None, *, auto_reset: bool = True,
                break_when_any_done: bool | None = None, tensordict: TensorDictBase | None = None, **kwargs):
        if policy is None or tensordict is None or auto_reset or break_when_any_done is not False \
                or callback is not None or kwargs:
            return super().rollout(max_steps, policy, callback, auto_reset=auto_reset,
                                   break_when_any_done=break_when_any_done, tensordict=tensordict, **kwargs)
        return self._batched_reward_rollout(max_steps, policy, self.maybe_reset(tensordict))

    def _batched_reward_rollout(self, max_steps: int, policy, start: TensorDictBase) -> TensorDictBase:
        transition, reward_model = self.world_model[0], self.world_model[1]
        state_keys, done_keys = self.state_keys, self.done_keys
        batch, device = start.batch_size, self.device
        # No done model: every imagined step's flags are False (what ``step`` fills in).
        not_done = self.not_done(batch)
        latent = {key: start.get(key) for key in state_keys}
        flags = {key: start.get(key, not_done[key]) for key in done_keys}
        steps, nexts = [], []
        for _ in range(max_steps):
            step = policy(TensorDict({**latent, **flags}, batch_size=batch, device=device))
            moved = transition(step.select(*transition.in_keys))
            latent = {key: moved.get(key) for key in state_keys}
            steps.append(step)
            nexts.append(latent)
            flags = not_done
        time_dim = len(batch)
        out = torch.stack(steps, time_dim)
        next_td = TensorDict(
            {key: torch.stack([n[key] for n in nexts], time_dim) for key in state_keys},
            batch_size=out.batch_size, device=device,
        )
        reward_keys = self.reward_keys
        scored = reward_model(next_td.select(*reward_model.in_keys))
        for key in reward_keys:
            next_td.set(key, scored.get(key))
        for key in done_keys:
            next_td.set(key, torch.stack([not_done[key]] * max_steps, time_dim))
        out.set("next", next_td)
        return out


class ScoreFunctionDreamerEnv(FixedSpecsDreamerEnv):
    """A :class:`~torchrl.envs.DreamerEnv` whose rollouts can skip recording autograd.

    With a score-function (REINFORCE) actor loss, which DreamerV3 uses for
    discrete actions, nothing is differentiated through the imagined trajectory:
    :class:`~torchrl.objectives.DreamerV3ActorLoss` re-scores the stopped actions
    from stopped states and the value loss reads the trajectory detached. The
    rollout still records a graph (the policy's samples are reparameterised, so
    every imagined step hangs off the actor's weights) that is then freed unused.
    With ``rollout_gradients=False`` ``rollout`` runs under ``torch.no_grad()``:
    the same values, without the recording. Leave it True for dynamics
    (pathwise) gradients.
    """

    def __init__(self, *args, rollout_gradients: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.rollout_gradients = rollout_gradients

    def rollout(self, *args, **kwargs):
        if self.rollout_gradients:
            return super().rollout(*args, **kwargs)
        with torch.no_grad():
            return super().rollout(*args, **kwargs)


class ClampedTanhTransform(SafeTanhTransform):
    """TorchRL's ``SafeTanhTransform`` forward in plain tensor ops.

    Upstream computes the clamped tanh inside a custom ``autograd.Function``, and
    AOTAutograd never caches a graph holding one ("Unsupported call_function
    target autograd_function_apply"): every warm start re-traced the compiled
    actor loss's joint graph. Same values (tanh clamped to +-(1 - resolution));
    autograd's gradient, which differs from upstream's only where the clamp is
    active (0 instead of about 2e-6 x the incoming gradient). The inverse
    (log-probabilities) stays upstream's.
    """

    def _call(self, x: torch.Tensor) -> torch.Tensor:
        lim = 1.0 - torch.finfo(x.dtype).resolution
        return x.tanh().clamp(-lim, lim)


class FixedBoundsTanhNormal(TanhNormal):
    """A :class:`~torchrl.modules.TanhNormal` over bounds fixed when the policy is built.

    Same distribution as upstream; the per-instance checks are dropped and the
    affine rescale is always applied (as upstream does under ``torch.compile``),
    which is exact for any bounds, ``[-1, 1]`` included. Validate the bounds once
    with :meth:`check_bounds` when building the policy.
    """

    def __init__(
        self,
        loc: torch.Tensor,
        scale: torch.Tensor,
        upscale: float = 5.0,
        low: torch.Tensor | float = -1.0,
        high: torch.Tensor | float = 1.0,
        event_dims: int | None = None,
        tanh_loc: bool = False,
        safe_tanh: bool = True,
    ):
        low = torch.as_tensor(low, device=loc.device, dtype=loc.dtype)
        high = torch.as_tensor(high, device=loc.device, dtype=loc.dtype)
        self.non_trivial_max = self.non_trivial_min = True  # Python bools: no test of tensors
        self.tanh_loc = tanh_loc
        self._event_dims = min(1, loc.ndim) if event_dims is None else event_dims
        self.device = loc.device
        self.upscale = upscale
        self.low, self.high = low, high
        squash = ClampedTanhTransform() if safe_tanh else D.TanhTransform()
        self._t = _PatchedComposeTransform(
            [squash, _PatchedAffineTransform(loc=(high + low) / 2, scale=(high - low) / 2)]
        )
        self.update(loc, scale)

    @staticmethod
    def check_bounds(low: torch.Tensor, high: torch.Tensor) -> None:
        if not bool((high > low).all()):
            raise ValueError(f"action bounds need high > low, got low={low.tolist()} high={high.tolist()}")


class TraceableOneHotCategorical(OneHotCategorical):
    """:class:`~torchrl.modules.OneHotCategorical` whose ``sample`` dynamo traces
    (see the module docstring): the same categorical draw, one-hot encoded."""

    def sample(self, sample_shape: torch.Size | tuple = torch.Size()) -> torch.Tensor:
        index = D.Categorical.sample(self, torch.Size(sample_shape))
        return torch.nn.functional.one_hot(index, self.num_samples)

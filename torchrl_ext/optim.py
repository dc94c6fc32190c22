"""DreamerV3's LaProp/AGC optimiser with a ``found_inf`` input, as fused Adam has.

TorchRL's :class:`~torchrl.trainers.algorithms.DreamerV3Optimizer` counts its
steps in a host int (``group["step"]``) and has no way to skip a step whose
gradients are NaN/inf without the host first reading a flag from the device.
A trainer that must not sync per update (CUDA) could only take such a step and
undo it: a copy of every weight and moment before each step, and a restore
after, a few hundred extra kernels per update whether the step was finite or not.

:class:`SkippableDreamerV3Optimizer` does the same math and reads
``optimizer.found_inf`` (a 0./1. tensor on the parameters' device, set before
``step()`` the way ``torch.amp.GradScaler`` sets it for fused Adam). The step
count lives on the device; a flagged step leaves weights, moments and the count
as they were, and a finite step costs two extra kernels (the gradients are
zeroed where flagged) plus a few scalar ops. With ``found_inf`` left ``None``
it steps unconditionally, like upstream.

Results match upstream's to float32 rounding: the learning rate and the bias
corrections become device scalars, so the last step's update is one division
where upstream multiplies by ``alpha`` (tests compare them with
``torch.testing.assert_close``).
"""

from __future__ import annotations

from typing import Any

import torch
from torchrl.trainers.algorithms import DreamerV3Optimizer


class SkippableDreamerV3Optimizer(DreamerV3Optimizer):
    """LaProp with adaptive gradient clipping whose step reads ``found_inf`` (see the module docstring).

    Same arguments as :class:`~torchrl.trainers.algorithms.DreamerV3Optimizer`;
    ``param_groups[i]["step"]`` is an int64 0-dim tensor on the parameters' device.
    """

    reads_found_inf = True  # trainers may set .found_inf and trust the step to skip

    def __init__(self, parameters, **kwargs: Any):
        super().__init__(parameters, **kwargs)
        self.found_inf: torch.Tensor | None = None
        for group in self.param_groups:
            group["step"] = self._step_tensor(group)

    @staticmethod
    def _step_tensor(group: dict) -> torch.Tensor:
        device = group["params"][0].device
        return torch.as_tensor(group["step"], dtype=torch.int64, device=device).clone()

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        for group in self.param_groups:  # upstream checkpoints hold a host int
            group["step"] = self._step_tensor(group)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._step_groups(self.found_inf)
        return loss

    @torch.no_grad()
    def masked_step(self, found_inf: torch.Tensor | None) -> None:
        """``step()`` reading ``found_inf`` from its argument, without torch.optim's step
        hooks and their profiler range (which ``torch.compile`` drops with a warning).
        Nothing is stored on the optimiser: an attribute written inside a traced update
        is a side effect some dynamo versions refuse on an optimiser."""
        self._step_groups(found_inf)

    def _step_groups(self, found_inf: torch.Tensor | None) -> None:
        if not any(p.grad is not None for group in self.param_groups for p in group["params"]):
            raise RuntimeError("DreamerV3 optimizer received no parameter gradients.")
        for group in self.param_groups:
            parameters = [p for p in group["params"] if p.grad is not None]
            if not parameters:
                continue
            self._step_group(group, parameters, found_inf)

    def _step_group(self, group: dict, parameters: list[torch.Tensor], found_inf: torch.Tensor | None) -> None:
        device = parameters[0].device
        skip = None if found_inf is None else found_inf.to(device=device, dtype=torch.bool).reshape(())
        step = group["step"]
        if skip is None:
            step.add_(1)
        else:
            step.add_((~skip).to(step.dtype))
        # Bias corrections and the warm-up from the device count, in float64 as
        # Python computes upstream's; a flagged first step (count 0) divides by 1.
        count = step.to(torch.float64).clamp_min(1)
        beta1, beta2 = group["beta1"], group["beta2"]
        warmup_steps = group["warmup_steps"]
        warmup = ((count - 1) / warmup_steps).clamp_max(1) if warmup_steps else torch.ones_like(count)
        learning_rate = group["lr"] * warmup
        rms_correction = (1 - beta2**count).float()
        # The update is momentum / (correction / lr): zero where lr is zero (the
        # first warm-up step) or the step is flagged (divisor inf).
        update_divisor = ((1 - beta1**count) / learning_rate).float()
        if skip is not None:
            update_divisor = torch.where(skip, torch.inf, update_divisor)

        gradients = [p.grad.float() for p in parameters]
        if skip is not None:
            # NaN/inf gradients must not reach the moments: zero them where
            # flagged, over one flat copy (two kernels, not one per tensor).
            flat = torch.cat([g.reshape(-1) for g in gradients])
            flat = torch.where(skip, 0.0, flat)
            gradients = [f.view_as(g) for f, g in zip(flat.split([g.numel() for g in gradients]), gradients)]
        if group["agc"]:
            gradient_norms = torch._foreach_norm(gradients)
            parameter_norms = torch._foreach_norm([p.detach().float() for p in parameters])
            torch._foreach_clamp_min_(parameter_norms, group["parameter_norm_min"])
            maximum_norms = torch._foreach_mul(parameter_norms, group["agc"])
            denominators = torch._foreach_maximum(gradient_norms, maximum_norms)
            gradients = list(torch._foreach_mul(gradients, torch._foreach_div(maximum_norms, denominators)))

        rms, momentum = self._moments(parameters)
        # A flagged step multiplies the moments by 1 and adds 0 (zeroed gradients).
        keep_rms = beta2 if skip is None else torch.where(skip, 1.0, beta2)
        keep_momentum = beta1 if skip is None else torch.where(skip, 1.0, beta1)
        torch._foreach_mul_(rms, keep_rms)
        torch._foreach_addcmul_(rms, gradients, gradients, value=1 - beta2)
        denominator = torch._foreach_sqrt(torch._foreach_div(rms, rms_correction))
        torch._foreach_add_(denominator, group["eps"])
        normalized = torch._foreach_div(gradients, denominator)
        torch._foreach_mul_(momentum, keep_momentum)
        torch._foreach_add_(momentum, normalized, alpha=1 - beta1)
        updates = torch._foreach_div(momentum, update_divisor)
        if parameters[0].dtype != torch.float32:
            updates = [u.to(p.dtype) for u, p in zip(updates, parameters)]
        torch._foreach_sub_(parameters, updates)

    def init_state(self) -> None:
        """Create every parameter's (zero) moments now rather than at its first step.

        The same values a first step would start from; a step traced by
        ``torch.compile`` or captured in a CUDA graph then finds its state in
        place instead of creating it (a second trace, or allocations inside the
        capture that the next replay would not repeat)."""
        self._moments([p for group in self.param_groups for p in group["params"]])

    def _moments(self, parameters: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        rms, momentum = [], []
        for parameter in parameters:
            state = self.state[parameter]
            if not state:
                state["rms"] = torch.zeros_like(parameter, dtype=torch.float32)
                state["momentum"] = torch.zeros_like(parameter, dtype=torch.float32)
            rms.append(state["rms"])
            momentum.append(state["momentum"])
        return rms, momentum

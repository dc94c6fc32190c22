"""What the Dreamer V1 and V3 learners share: the learner contract.

``prepare(batch)`` turns sampled uint8 steps into the world model's (B, T)
input, ``compile()`` / ``warmup(batch)`` compile and exercise the actor and
value losses, ``update(batch)`` (per algorithm) never talks to the host:
losses and gradient norms are stacked into one device tensor and summed in
:class:`MetricsAccumulator`; ``flush_metrics()`` does the single host transfer,
once per log interval. ``state_dict()`` / ``load_state_dict()`` hold weights
and optimisers (plus what a subclass adds in ``_extra_state``).
"""

from __future__ import annotations

import abc
import contextlib
import time
from typing import Callable

import torch
from tensordict import TensorDictBase
from torch.profiler import record_function

from dreamer.system.compile import maybe_compile
from dreamer.config import Config
from dreamer.run.health import NonFiniteGuard


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


class BaseLearner(abc.ABC):
    """Subclasses build ``world_model_loss``, ``actor_loss``, ``value_loss`` and
    ``optimizers`` and implement ``update``, ``_prepare_inputs`` (observations and
    actions as their world model reads them) and ``_warmup_step``."""

    METRIC_NAMES: tuple[str, ...] = ()

    def __init__(self, cfg: Config, models, device: torch.device, autocast_dtype: torch.dtype | None = None):
        self.cfg = cfg
        self.models = models
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.batch_size = cfg.buffer.batch_size
        self.batch_length = cfg.buffer.batch_length
        self.obs_key = models.obs_key
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.metrics = MetricsAccumulator(self.METRIC_NAMES, device)
        self.nonfinite = NonFiniteGuard(device)
        # Data-parallel learners average each phase's gradients across ranks
        # here (dreamer.distributed.GradientAverager); None on one process.
        self.grad_sync = None

    # -- data -----------------------------------------------------------------
    def prepare(self, batch: TensorDictBase) -> TensorDictBase:
        """Sampled uint8 steps (B*T) on this device -> the world model's input (B, T)."""
        with record_function("## train/transform ##"):
            batch = self._prepare_inputs(batch.reshape(self.batch_size, self.batch_length))
            a = self.cfg.algo
            if a.reward_scale != 1.0:
                batch.set(("next", "reward"), batch.get(("next", "reward")) * a.reward_scale)
            # Each sequence starts from a zero latent, as in Dreamer.
            batch.set("state", torch.zeros(*batch.shape, a.latent_state_dim, device=self.device))
            batch.set("belief", torch.zeros(*batch.shape, a.rssm_hidden_dim, device=self.device))
        return batch

    @abc.abstractmethod
    def _prepare_inputs(self, batch: TensorDictBase) -> TensorDictBase:
        """(B, T) uint8 steps -> observations and actions as this world model reads them."""

    # -- compile --------------------------------------------------------------
    def _compilable(self) -> dict[str, Callable]:
        """The attribute each loss is called through -> the eager loss it holds."""
        return {"_actor_loss_fn": self.actor_loss, "_value_loss_fn": self.value_loss}

    def compile(self) -> None:
        """Actor and value losses through torch.compile (compile.*); the world model stays eager."""
        for attr, fn in self._compilable().items():
            setattr(self, attr, maybe_compile(fn, self.cfg.compile))

    @contextlib.contextmanager
    def _eager_losses(self):
        eager = self._compilable()
        compiled = {attr: getattr(self, attr) for attr in eager}
        for attr, fn in eager.items():
            setattr(self, attr, fn)
        try:
            yield
        finally:
            for attr, fn in compiled.items():
                setattr(self, attr, fn)

    def warmup(self, batch: TensorDictBase) -> float:
        """Compile and exercise the (compiled) losses, forward and backward, on a
        real batch before the first update; no optimiser step, and the global RNG
        streams are left as they were (a resumed run continues its own). Returns
        seconds, the eager pass and the world-model forward included."""
        if not self.cfg.compile.enabled:
            return 0.0
        start = time.perf_counter()
        cuda = [self.device.index or 0] if self.device.type == "cuda" else []
        # Under the update's autocast: dynamo guards on the autocast state, so a
        # warm-up outside it would leave the first update to trace again.
        with torch.random.fork_rng(devices=cuda):
            prepared = self.prepare(batch.clone())
            with self._autocast():
                with torch.no_grad():
                    _, latent = self.world_model_loss(prepared)
                # One eager pass first. TorchRL's envs fill a key cache on first use
                # (EnvBase._cache); traced with it empty, dynamo guards on the empty
                # cache and traces the whole imagination again on the next call.
                with self._eager_losses():
                    self._warmup_step(prepared, latent)
                for _ in range(self.cfg.compile.warmup_iters):
                    self._warmup_step(prepared, latent)
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    @abc.abstractmethod
    def _warmup_step(self, prepared: TensorDictBase, latent: TensorDictBase) -> None:
        """One forward and backward of the actor and value losses, as ``update`` calls them."""

    # -- update ---------------------------------------------------------------
    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    @abc.abstractmethod
    def update(self, batch: TensorDictBase) -> None:
        """One update of every part, with no host sync."""

    def flush_metrics(self) -> dict[str, float]:
        metrics = self.metrics.flush(self.nonfinite.counts())
        self.nonfinite.reset()
        return metrics

    # -- checkpoint -----------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "modules": self.models.modules.state_dict(),
            "optimizers": {k: o.state_dict() for k, o in self.optimizers.items()},
            **self._extra_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.models.modules.load_state_dict(state["modules"])
        for k, o in self.optimizers.items():
            o.load_state_dict(state["optimizers"][k])
        self._load_extra_state(state)

    def _extra_state(self) -> dict:
        return {}

    def _load_extra_state(self, state: dict) -> None:
        pass

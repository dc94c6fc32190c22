"""The learner skeleton every Dreamer algorithm runs on.

``prepare(batch)`` turns sampled uint8 steps into the world model's (B, T)
input; ``compile()`` / ``warmup(batch)`` compile and exercise the actor and
value losses; ``update(batch)`` runs three phases, world model -> actor ->
value, each one's loss under its profiling range and the update's autocast;
``_step`` (backward, gradient sync, grad norm / clip, non-finite flag,
optimiser step) after the world model's, and once for the actor's and value's
together (one backward: they share no parameters). The update never talks to the host: losses
and gradient norms are stacked into one device tensor and summed in
:class:`MetricsAccumulator`; ``flush_metrics()`` does the single host transfer,
once per log interval. ``state_dict()`` / ``load_state_dict()`` hold weights
and optimisers (plus what an algorithm adds in ``_extra_state``).

``compile.update`` picks how the update body runs (dreamer/algos/update_paths.py):
the card's (eager body, compiled losses), the whole body as one compiled graph,
or that body replayed from a CUDA graph; ``update()`` is the same call for all.

An algorithm (``algos/<name>/learner.py``) subclasses :class:`BaseLearner` and
supplies, through the constructor, its parameter groups, optimisers, the
losses ``compile()`` may compile and its :class:`~dreamer.algos.nonfinite.NonFinitePolicy`;
and, as methods, how its inputs are prepared (``_prepare_inputs``) and how each
phase's loss and metrics are computed (``_world_model_phase``,
``_actor_phase``, ``_value_phase``).
"""

from __future__ import annotations

import abc
import contextlib
from typing import Any, Callable, NamedTuple

import torch
from tensordict import TensorDictBase
from torch import nn
from torch.nn.utils import clip_grad_norm_, get_total_norm
from torch.profiler import record_function

from dreamer.algos.nonfinite import NonFiniteGuard, NonFinitePolicy
from dreamer.algos.update_paths import compile_whole_update, resolve_update_path, restored_after, tensor_leaves
from dreamer.config import AlgoConfig, CompileConfig
from dreamer.errors import UserError
from dreamer.system.compile import maybe_compile
from dreamer.system.timing import device_clock
from torchrl_ext import CapturedStep, stale_held_out_views

PHASES = ("world_model", "actor", "value")  # update order; also the optimiser names


class MetricsAccumulator:
    """Running sums of a fixed vector of metrics, kept on the device."""

    def __init__(self, names: tuple[str, ...], device: torch.device):
        self.names = names
        self.total = torch.zeros(len(names), device=device)
        self.count = 0

    def add(self, values: torch.Tensor) -> None:
        self.accumulate(values)
        self.count += 1

    def accumulate(self, values: torch.Tensor) -> None:
        """The device half of ``add`` (what a compiled or captured update runs); the
        caller counts the update."""
        self.total.add_(values.detach().float())

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


def profile_range(name: str):
    """``record_function(name)``; left out while dynamo traces (it would drop it with a warning)."""
    if torch.compiler.is_compiling():
        return contextlib.nullcontext()
    return record_function(name)


class PhaseOut(NamedTuple):
    """What one phase hook returns."""

    loss: torch.Tensor  # () what this phase's optimiser minimises
    metrics: list[torch.Tensor]  # () each: this phase's share of METRIC_NAMES, in order
    out: Any = None  # what later phases read: the posterior latents, the imagined rollout


def param_groups(modules: nn.ModuleDict, world_model_parts: tuple[str, ...]) -> dict[str, list[nn.Parameter]]:
    """Each phase's parameters: the world model's parts, the actor, the value head."""
    return {
        "world_model": [p for k in world_model_parts for p in modules[k].parameters()],
        "actor": list(modules["actor"].parameters()),
        "value": list(modules["value"].parameters()),
    }


class BaseLearner(abc.ABC):
    """The skeleton; subclasses supply the algorithm (see the module docstring).

    ``METRIC_NAMES`` lists what the phases' metrics are, in order, followed by the
    three gradient norms (world model, actor, value) the skeleton appends.
    """

    METRIC_NAMES: tuple[str, ...] = ()
    # Why this algorithm's whole update cannot be one compiled graph (None: it can).
    NO_COMPILED_WHOLE_UPDATE: str | None = None

    def __init__(
        self,
        algo_cfg: AlgoConfig,
        compile_cfg: CompileConfig,
        models,
        device: torch.device,
        *,
        batch_size: int,
        batch_length: int,
        autocast_dtype: torch.dtype | None,
        params: dict[str, list[nn.Parameter]],
        optimizers: dict[str, torch.optim.Optimizer],
        nonfinite_policy: NonFinitePolicy,
        grad_clip: float | None,
        compilable: dict[str, Callable],
    ):
        """``params`` / ``optimizers``: one per phase (``PHASES``). ``grad_clip``: the
        global-norm clip ``_step`` applies, or None where the optimiser clips itself
        (the norm is then only measured). ``compilable``: name -> eager loss; phases
        call them through ``self.loss_fns[name]``, which ``compile()`` swaps for
        compiled versions."""
        assert set(params) == set(optimizers) == set(PHASES), (set(params), set(optimizers))
        self.algo_cfg = algo_cfg
        self.compile_cfg = compile_cfg
        self.models = models
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.batch_size = batch_size
        self.batch_length = batch_length
        self.obs_key = models.obs_key
        self.params = params
        self.optimizers = optimizers
        self.nonfinite_policy = nonfinite_policy
        self.grad_clip = grad_clip
        self._eager_fns = dict(compilable)
        self.loss_fns: dict[str, Callable] = dict(compilable)
        self.metrics = MetricsAccumulator(self.METRIC_NAMES, device)
        self.nonfinite = NonFiniteGuard(device)
        # Data-parallel learners average each phase's gradients across ranks
        # here (dreamer.system.distributed.GradientAverager); None on one process.
        self.grad_sync = None
        self.update_path = resolve_update_path(compile_cfg, device)
        if self.update_path != "card" and compile_cfg.enabled and self.NO_COMPILED_WHOLE_UPDATE:
            raise UserError(
                f"compile.update={self.update_path} compiles the whole update, and {algo_cfg.name}'s cannot be "
                f"one graph ({self.NO_COMPILED_WHOLE_UPDATE}): use compile.update=card"
                + (", or compile=off to capture the eager update" if self.update_path == "captured" else "")
            )
        # The update body as it runs now: eager (the card's path, losses compiled or
        # not) until compile() makes it the whole compiled graph or the captured one.
        self._run_update: Callable = self._update_body
        self._whole_update: Callable | None = None  # the compiled whole update (whole, captured)
        self._grads_in_place = False  # gradients zeroed in place, never dropped (whole, captured)
        self._check_held_out_views()

    def _check_held_out_views(self) -> None:
        """The actor loss imagines through held-out views of the world model's (and a
        pathwise loss's critic's) weights (torchrl_ext/held_out.py). Anything that gave
        those weights new memory (a move to another device or dtype after the build)
        would leave it imagining with weights no optimiser updates: refuse at once."""
        loss = self._eager_fns["actor"]
        if stale := stale_held_out_views(loss, *(m for m in vars(loss).values() if isinstance(m, nn.Module))):
            raise RuntimeError(f"held-out views no longer share the trained weights' memory: {stale}")

    # -- data -----------------------------------------------------------------
    def prepare(self, batch: TensorDictBase) -> TensorDictBase:
        """Sampled uint8 steps (B*T) on this device -> the world model's input (B, T)."""
        with profile_range("## train/transform ##"):
            batch = self._prepare_inputs(batch.reshape(self.batch_size, self.batch_length))
            a = self.algo_cfg
            if a.reward_scale != 1.0:
                batch.set(("next", "reward"), batch.get(("next", "reward")) * a.reward_scale)
            # Each sequence starts from a zero latent, as in Dreamer.
            batch.set("state", torch.zeros(*batch.shape, a.latent_state_dim, device=self.device))  # (B, T, S)
            batch.set("belief", torch.zeros(*batch.shape, a.rssm_hidden_dim, device=self.device))  # (B, T, H)
        return batch

    @abc.abstractmethod
    def _prepare_inputs(self, batch: TensorDictBase) -> TensorDictBase:
        """(B, T) uint8 steps -> observations and actions as this world model reads them."""

    # -- the phases (per algorithm) --------------------------------------------
    @abc.abstractmethod
    def _world_model_phase(self, batch: TensorDictBase) -> PhaseOut:
        """World-model loss on the prepared (B, T) batch; ``out``: the posterior latents."""

    @abc.abstractmethod
    def _actor_phase(self, latent: TensorDictBase) -> PhaseOut:
        """Actor loss imagined from ``latent``; ``out``: the imagined rollout."""

    @abc.abstractmethod
    def _value_phase(self, batch: TensorDictBase, latent: TensorDictBase, imagined: TensorDictBase) -> PhaseOut:
        """Value loss on the imagined rollout (and, if the algorithm wants, the replayed batch)."""

    def _after_value_step(self) -> None:
        """Runs after the value step, inside its range (V3: the slow critic follows)."""

    # -- compile --------------------------------------------------------------
    def compile(self) -> None:
        """Make the configured update path (compile.update) the one ``update`` runs."""
        if self.update_path == "card":
            self._compile_card()
        else:
            self._compile_whole()

    def _compile_card(self) -> None:
        """Compilable losses through torch.compile (compile.*); the world model stays eager
        (an algorithm may compile a part of it: V3 its RSSM step)."""
        self.loss_fns = {name: maybe_compile(fn, self.compile_cfg) for name, fn in self._eager_fns.items()}

    def _compile_whole(self) -> None:
        """The whole update body, compiled into one graph (compile.enabled), and on the
        captured path replayed from a CUDA graph. Optimiser state and gradient buffers are
        created first: a step that created them would trace twice, or allocate inside the
        capture (gradients are zeroed in place from here on: ``_clear_grads``)."""
        self._init_optimizer_state()
        for p in (p for params in self.params.values() for p in params):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self._grads_in_place = True
        body = self._update_body
        if self.compile_cfg.enabled:
            body = self._whole_update = compile_whole_update(self._update_body, self.compile_cfg)
        if self.update_path == "captured":
            self._match_capturable()
            body = CapturedStep(body, warmup=max(1, self.compile_cfg.warmup_iters), device=self.device)
        self._run_update = body

    def _match_capturable(self) -> None:
        """torch.optim refuses to step inside a CUDA graph capture unless the optimiser says
        ``capturable`` (fused Adam keeps its step counts on the device already). Set on the
        captured path, again after loading a checkpoint (its param groups say what the
        writing run's path was)."""
        capturable = self.update_path == "captured"
        for optimizer in self.optimizers.values():
            for group in optimizer.param_groups:
                if "capturable" in group:
                    group["capturable"] = capturable

    @contextlib.contextmanager
    def _eager_losses(self):
        compiled, self.loss_fns = self.loss_fns, dict(self._eager_fns)
        try:
            yield
        finally:
            self.loss_fns = compiled

    def warmup(self, batch: TensorDictBase) -> float:
        """Compile and exercise the (compiled) losses and the world model, forward
        and backward, on a real batch before the first update; no optimiser step,
        and the global RNG streams are left as they were (a resumed run continues
        its own). Returns seconds, the eager pass and the world model included."""
        if not self.compile_cfg.enabled:
            return 0.0
        if self._whole_update is not None:
            return self._warmup_whole(batch)
        start = device_clock(self.device)
        cuda = [self.device.index or 0] if self.device.type == "cuda" else []
        # Under the update's autocast: dynamo guards on the autocast state, so a
        # warm-up outside it would leave the first update to trace again.
        with torch.random.fork_rng(devices=cuda):
            prepared = self.prepare(batch.clone())
            with self._autocast():
                # Forward and backward, as the update runs it: a compiled RSSM step
                # (compile.rssm_step) is specialised to grad mode.
                world_model = self._world_model_phase(prepared)
            world_model.loss.backward()
            latent = world_model.out
            with self._autocast():
                # One eager pass first. TorchRL's envs fill a key cache on first use
                # (EnvBase._cache); traced with it empty, dynamo guards on the empty
                # cache and traces the whole imagination again on the next call.
                with self._eager_losses():
                    self._warmup_step(prepared, latent)
                for _ in range(self.compile_cfg.warmup_iters):
                    self._warmup_step(prepared, latent)
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=True)
        return device_clock(self.device) - start

    def _init_optimizer_state(self) -> None:
        for optimizer in self.optimizers.values():
            init_state = getattr(optimizer, "init_state", None)
            if init_state is not None:
                init_state()

    def _warmup_whole(self, batch: TensorDictBase) -> float:
        """Compile the whole update on ``batch``: one eager update (TorchRL's key caches
        filled, as the card's warm-up does), then compile.warmup_iters (at least one)
        compiled ones, after which every tensor the updates changed (weights, optimiser
        state, statistics, metrics) and the RNG streams are put back as they were."""
        start = device_clock(self.device)
        cuda = [self.device.index or 0] if self.device.type == "cuda" else []
        guard = self.nonfinite
        state = tensor_leaves(self.state_dict()) + [self.metrics.total, guard.skipped, guard.streak, guard.longest]
        with torch.random.fork_rng(devices=cuda), restored_after(state):
            self._update_body(batch.clone())
            for _ in range(max(1, self.compile_cfg.warmup_iters)):
                self._whole_update(batch.clone())
        return device_clock(self.device) - start

    def input_buffer(self) -> TensorDictBase | None:
        """The captured update's static inputs, once captured: a sample copied into them
        in place is replayed with no copy of its own. None on the other paths."""
        if isinstance(self._run_update, CapturedStep) and self._run_update.ready:
            return self._run_update.static_inputs
        return None

    def _warmup_step(self, prepared: TensorDictBase, latent: TensorDictBase) -> None:
        """One forward and backward of the actor and value losses, as ``update`` calls them:
        one backward for both (V3's value loss may read critic logits the actor loss made)."""
        actor = self._actor_phase(latent)
        value = self._value_phase(prepared, latent, actor.out)
        torch.autograd.backward([actor.loss, value.loss])

    # -- update ---------------------------------------------------------------
    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def update(self, batch: TensorDictBase) -> None:
        """One update of every part (world model, actor, value) with no host sync, on
        the path compile() chose (eager before)."""
        self._run_update(batch)
        self.metrics.count += 1

    def _update_body(self, batch: TensorDictBase) -> None:
        """The update itself: device work only, the same on every path."""
        batch = self.prepare(batch)
        with profile_range("## train/world_model ##"):
            with self._autocast():
                world_model = self._world_model_phase(batch)
            # Stepped before the imagination, which runs on the updated world model.
            ((wm_grad, wm_inf),) = self._step({"world_model": world_model.loss})
        with profile_range("## train/actor ##"):
            with self._autocast():
                actor = self._actor_phase(world_model.out)
        with profile_range("## train/value ##"):
            with self._autocast():
                value = self._value_phase(batch, world_model.out, actor.out)
            # One backward for both: they share no parameter (each holds the other's
            # network out) and the value loss reads the rollout detached, so each
            # gets exactly the gradients a backward of its own would give. V3's
            # REINFORCE value loss reads critic logits the actor phase computed
            # (OneCriticPassDreamerV3ActorLoss): inside one compiled graph, which
            # only a single backward may run.
            (actor_grad, actor_inf), (value_grad, value_inf) = self._step({"actor": actor.loss, "value": value.loss})
            self._after_value_step()
        self.metrics.accumulate(
            torch.stack([*world_model.metrics, *actor.metrics, *value.metrics, wm_grad, actor_grad, value_grad])
        )
        self.nonfinite.observe(torch.stack([wm_inf, actor_inf, value_inf]))

    def _step(self, losses: dict[str, torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One backward over ``losses`` (phase name -> loss), then per phase: gradient
        sync, grad norm (and clip), step; a non-finite gradient norm skips that phase's
        step on the device, the way ``nonfinite_policy`` does it. Returns (grad norm,
        found_inf 0./1.) per phase, in order. One range name for every phase, so a
        trace sums the optimisation work."""
        with profile_range("## train/optim ##"):
            for name in losses:
                self._clear_grads(self.params[name])
            # One backward of the sum (the same gradients as torch.autograd.backward over the
            # list, which dynamo does not trace; Tensor.backward it does).
            sum(losses.values()).backward()
            stepped = []
            for name in losses:
                opt, params = self.optimizers[name], self.params[name]
                if self.grad_sync is not None:
                    self.grad_sync(params)
                grad_norm = self._grad_norm(params)
                found_inf = (~torch.isfinite(grad_norm)).float()
                self.nonfinite_policy.step(opt, params, found_inf)
                stepped.append((grad_norm, found_inf))
        return stepped

    def _clear_grads(self, params: list[nn.Parameter]) -> None:
        """Before a backward: gradients dropped, as zero_grad(set_to_none=True) drops them
        (which dynamo does not trace); on the whole and captured paths zeroed in place
        instead. Those gradients outlive every update (a CUDA graph's replays write the
        same buffers), and no traced ``p.grad = None`` is read back: dynamo (torch 2.13)
        then attaches the gradient's source to its one shared None constant, and a later
        compile in the process rebuilds a None from that stale source."""
        if self._grads_in_place:
            torch._foreach_zero_([p.grad for p in params])
            return
        for p in params:
            p.grad = None

    def _grad_norm(self, params: list[nn.Parameter]) -> torch.Tensor:
        if self.grad_clip is None:
            # Norm of the gradients about to be applied (the optimiser clips, e.g. V3's AGC).
            return get_total_norm([p.grad for p in params if p.grad is not None])
        return clip_grad_norm_(params, self.grad_clip)

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
        self._check_held_out_views()
        self._match_capturable()
        if self._run_update is not self._update_body:
            # A compiled whole update traced with every parameter's optimiser state in
            # place (a checkpoint from before some first step lacks some). Loaded state
            # is new tensors: a captured graph would go on reading the old ones, so the
            # next update captures again.
            self._init_optimizer_state()
            if isinstance(self._run_update, CapturedStep):
                self._run_update.invalidate()

    def _extra_state(self) -> dict:
        return {}

    def _load_extra_state(self, state: dict) -> None:
        pass

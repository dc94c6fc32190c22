"""The learner skeleton every Dreamer algorithm runs on.

``prepare(batch)`` turns sampled uint8 records into the world model's (B, T)
input; ``update(batch)`` runs three phases (world model, actor, value), each
one's losses under its profiling range and the update's autocast, and steps the
optimisers (``_step``: backward, gradient sync, grad norm / clip, non-finite
flag, optimiser step):

- in the reference's order (``joint_update``, DreamerV3's agent): every phase's
  losses from the same weights, one backward of their sum, every optimiser
  stepped with one non-finite flag for the update;
- in Dreamer's sequential order otherwise: the world model is stepped first,
  then the actor and value imagine with the updated world model from the
  posteriors of the old one and are stepped together (one backward: they share
  no parameters).

Each phase returns its losses unscaled and keyed by name; the learner weighs
them by ``loss_scales``, whose names must be exactly the losses' (as the
reference's agent checks them), and reports every metric by name. The update
never talks to the host: metrics are stacked into one device tensor and summed
in :class:`MetricsAccumulator`; ``flush_metrics()`` does the single host
transfer, once per log interval. ``state_dict()`` / ``load_state_dict()`` hold
weights and optimisers (plus what an algorithm adds in ``_extra_state``).

``compile.update`` picks how the update body runs: a strategy object from
dreamer/algos/update_paths.py (the compiled losses, the whole body as one
graph, or that body replayed from a CUDA graph); ``compile()`` / ``warmup()`` /
``update()`` go through it.

An algorithm (``algos/<name>/learner.py``) subclasses :class:`BaseLearner` and
supplies, through the constructor, its parameter groups, optimisers, loss
scales, the losses the compiled-losses path may compile and its
:class:`~dreamer.algos.nonfinite.NonFinitePolicy`; and, as methods, how its
inputs are prepared (``_prepare_inputs``) and each phase's losses
(``_world_model_phase``, ``_actor_phase``, ``_value_phase``).
"""

from __future__ import annotations

import abc
import contextlib
from typing import Any, Callable, Iterator, NamedTuple

import torch
from tensordict import TensorDictBase
from torch import nn
from torch.nn.utils import clip_grad_norm_, get_total_norm
from torch.profiler import record_function

from dreamer.algos.nonfinite import NonFiniteGuard, NonFinitePolicy
from dreamer.algos.update_paths import UpdatePath, make_update_path, restored_after, tensor_leaves
from dreamer.config import AlgoConfig, CompileConfig
from dreamer.envs.keys import IS_FIRST
from torchrl_ext import stale_held_out_views

PHASES = ("world_model", "actor", "value")  # update order; also the optimiser names
GRAD_NORMS = tuple(f"grad_norm_{phase}" for phase in PHASES)


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

    losses: dict[str, torch.Tensor]  # () each, unscaled: this phase's optimiser minimises them, weighed
    metrics: dict[str, torch.Tensor]  # () each: what else the phase reports (no gradient)
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

    ``METRIC_NAMES`` lists every metric an update reports: its losses (the keys of
    ``loss_scales``), the phases' other metrics and the three gradient norms
    (``GRAD_NORMS``), in the order they are logged.
    """

    METRIC_NAMES: tuple[str, ...] = ()
    # Why this algorithm's whole update cannot be one compiled graph (None: it can).
    NO_COMPILED_WHOLE_UPDATE: str | None = None

    @classmethod
    def refuse_env(cls, algo_cfg: AlgoConfig, discrete_actions: bool) -> None:
        """Raise UserError when this algorithm, so configured, cannot learn an env with these
        actions: the run and ``--check`` ask before anything is written."""

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
        loss_scales: dict[str, float],
        nonfinite_policy: NonFinitePolicy,
        grad_clip: float | None,
        compilable: dict[str, Callable],
        joint_update: bool = False,
    ):
        """``params`` / ``optimizers``: one per phase (``PHASES``). ``loss_scales``: each loss's
        weight, by the name its phase gives it. ``grad_clip``: the global-norm clip ``_step``
        applies, or None where the optimiser clips itself (the norm is then only measured).
        ``compilable``: name -> eager loss; phases call them through ``self.loss_fns[name]``,
        which the compiled-losses path swaps for compiled versions. ``joint_update``: the
        reference's order (see the module docstring)."""
        assert set(params) == set(optimizers) == set(PHASES), (set(params), set(optimizers))
        assert set(loss_scales) | set(GRAD_NORMS) <= set(self.METRIC_NAMES), (loss_scales, self.METRIC_NAMES)
        self.algo_cfg = algo_cfg
        self.models = models
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.batch_size = batch_size
        self.batch_length = batch_length
        self.obs_key = models.obs_key
        self.params = params
        self.optimizers = optimizers
        self.loss_scales = dict(loss_scales)
        self.nonfinite_policy = nonfinite_policy
        self.grad_clip = grad_clip
        self.joint_update = joint_update
        self._eager_fns = dict(compilable)
        self.loss_fns: dict[str, Callable] = dict(compilable)
        self.metrics = MetricsAccumulator(self.METRIC_NAMES, device)
        self.nonfinite = NonFiniteGuard(device)
        # Data-parallel learners average each phase's gradients across ranks
        # here (dreamer.system.distributed.GradientAverager); None on one process.
        self.grad_sync = None
        self._grads_in_place = False  # gradients zeroed in place, never dropped (whole, captured)
        self.path = make_update_path(self, compile_cfg, device)
        # What the path compiles with (auto on CUDA captures the eager body: compile off).
        self.compile_cfg = self.path.compile_cfg
        self._check_held_out_views()

    @property
    def update_path(self) -> UpdatePath:
        return self.path.path

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
        """Sampled uint8 records (B*T) on this device -> the world model's input (B, T)."""
        with profile_range("## train/transform ##"):
            batch = self._prepare_inputs(batch.reshape(self.batch_size, self.batch_length))
            a = self.algo_cfg
            if a.reward_scale != 1.0:
                batch.set(("next", "reward"), batch.get(("next", "reward")) * a.reward_scale)
            first = batch.get(IS_FIRST, None)  # (B, T, 1)
            if first is None:
                first = torch.zeros(*batch.shape, 1, dtype=torch.bool, device=self.device)
            else:
                # A record followed by an episode's first one ends its episode, flagged done or not
                # (a restarted env, a resumed run): no return runs from one episode into the next.
                done = batch.get(("next", "done"))
                batch.set(("next", "done"), done | torch.cat([first[:, 1:], torch.zeros_like(first[:, :1])], 1))
            # A sequence starts from the RSSM's reset state, as an episode does (the reference
            # without replay context): its first record is read as an episode's first.
            first = torch.cat([torch.ones_like(first[:, :1]), first[:, 1:]], 1)
            batch.set(IS_FIRST, first)
            batch.set("state", torch.zeros(*batch.shape, a.latent_state_dim, device=self.device))  # (B, T, S)
            batch.set("belief", torch.zeros(*batch.shape, a.rssm_hidden_dim, device=self.device))  # (B, T, H)
        return batch

    @staticmethod
    def imagination_starts(latent: TensorDictBase) -> TensorDictBase:
        """Every step's posterior (B, T) -> (B*T,) imagination start states, no gradient to
        the world model (DreamerV3's ``ac_grads: False``), as both Dreamers imagine. The
        posteriors are the rollout's ``("next", ...)`` outputs; its root ``state`` and
        ``belief`` are each step's input: the step before's posterior or, at a sequence's
        start and at an ``is_first``, the zeroed reset state, which no observation informs."""
        return latent.get("next").select("state", "belief").reshape(-1).detach()

    @abc.abstractmethod
    def _prepare_inputs(self, batch: TensorDictBase) -> TensorDictBase:
        """(B, T) uint8 steps -> observations and actions as this world model reads them."""

    # -- the phases (per algorithm) --------------------------------------------
    @abc.abstractmethod
    def _world_model_phase(self, batch: TensorDictBase) -> PhaseOut:
        """World-model losses on the prepared (B, T) batch; ``out``: the posterior latents."""

    @abc.abstractmethod
    def _actor_phase(self, latent: TensorDictBase) -> PhaseOut:
        """Actor loss imagined from ``latent``; ``out``: the imagined rollout."""

    @abc.abstractmethod
    def _value_phase(self, batch: TensorDictBase, latent: TensorDictBase, imagined: TensorDictBase) -> PhaseOut:
        """Value losses on the imagined rollout (and, if the algorithm wants, the replayed batch)."""

    def _after_value_step(self, skipped: torch.Tensor) -> None:
        """Runs after the value step, inside its range (a slow critic follows, unless
        ``skipped``: a 0./1. device scalar, 1 where the update was skipped as non-finite)."""

    def _statistics(self) -> list[torch.Tensor]:
        """Running statistics the losses update as they run (V3: the return percentiles); an
        update skipped as non-finite puts them back."""
        return []

    # -- compile (through the update path) --------------------------------------
    def compile(self) -> None:
        """Make the configured update path (compile.update) the one ``update`` runs."""
        self.path.compile()

    def warmup(self, batch: TensorDictBase) -> float:
        """Compile and exercise the path's compiled code on a real batch before the first
        update; the run's state and RNG streams are left as they were. Returns seconds."""
        return self.path.warmup(batch)

    def compile_losses(self, compile_fn: Callable[[Callable, CompileConfig], Callable]) -> None:
        """The compilable losses through ``compile_fn`` (an algorithm may compile more of its
        update: V3 its RSSM step)."""
        self.loss_fns = {name: compile_fn(fn, self.compile_cfg) for name, fn in self._eager_fns.items()}

    @contextlib.contextmanager
    def held_statistics(self) -> Iterator[None]:
        """The block's forward passes leave the running statistics as they were."""
        with restored_after(self._statistics()):
            yield

    def forward_and_backward(self, batch: TensorDictBase) -> None:
        """Every phase's losses and their gradients on a prepared batch, as ``update`` computes
        them, without an optimiser step (the compiled losses' warm-up)."""
        if self.joint_update:
            sum(self._phase_losses(self._forward(batch)).values()).backward()
            return
        with self._autocast():
            world_model = self._world_model_phase(batch)
        self._weighted(world_model).backward()
        with self._autocast():
            actor = self._actor_phase(world_model.out)
            value = self._value_phase(batch, world_model.out, actor.out)
        # One backward for both (see _update_body).
        (self._weighted(actor) + self._weighted(value)).backward()

    def drop_grads(self) -> None:
        for optimizer in self.optimizers.values():
            optimizer.zero_grad(set_to_none=True)

    def prepare_state_in_place(self) -> None:
        """Optimiser state and gradient buffers created now, gradients zeroed in place from
        here on (what one compiled graph, or a CUDA graph's replays, keep reading)."""
        self._init_optimizer_state()
        for p in (p for params in self.params.values() for p in params):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self._grads_in_place = True

    def state_tensors(self) -> list[torch.Tensor]:
        """Every tensor an update changes: weights, optimiser state, statistics, metrics."""
        guard = self.nonfinite
        return tensor_leaves(self.state_dict()) + [self.metrics.total, guard.skipped, guard.streak, guard.longest]

    def set_capturable(self, capturable: bool) -> None:
        """torch.optim refuses to step inside a CUDA graph capture unless the optimiser says
        ``capturable`` (fused Adam keeps its step counts on the device already). Set on the
        captured path, again after loading a checkpoint (its param groups say what the
        writing run's path was)."""
        for optimizer in self.optimizers.values():
            for group in optimizer.param_groups:
                if "capturable" in group:
                    group["capturable"] = capturable

    def _init_optimizer_state(self) -> None:
        for optimizer in self.optimizers.values():
            init_state = getattr(optimizer, "init_state", None)
            if init_state is not None:
                init_state()

    def input_buffer(self) -> TensorDictBase | None:
        """The captured update's static inputs, once captured: a sample copied into them
        in place is replayed with no copy of its own. None on the other paths."""
        return self.path.input_buffer()

    # -- update ---------------------------------------------------------------
    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def update(self, batch: TensorDictBase) -> None:
        """One update of every part (world model, actor, value) with no host sync, on
        the path compile() chose (eager before)."""
        self.path(batch)
        self.metrics.count += 1

    def _weighted(self, phase: PhaseOut) -> torch.Tensor:
        """A phase's losses, each times its scale: what its optimiser minimises."""
        return sum(self.loss_scales[name] * loss for name, loss in phase.losses.items())

    def _check_loss_names(self, phases: dict[str, PhaseOut]) -> None:
        """Every loss of an update has a scale and every scale a loss (a Python check:
        traced away by torch.compile)."""
        losses = {name for phase in phases.values() for name in phase.losses}
        assert losses == set(self.loss_scales), (sorted(losses), sorted(self.loss_scales))

    def _phase_losses(self, phases: dict[str, PhaseOut]) -> dict[str, torch.Tensor]:
        """Phase -> its weighted loss."""
        self._check_loss_names(phases)
        return {name: self._weighted(phase) for name, phase in phases.items()}

    def _forward(self, batch: TensorDictBase) -> dict[str, PhaseOut]:
        """Every phase on the same weights (the reference's order): the actor imagines from
        the world model's posteriors before any step."""
        with profile_range("## train/world_model ##"), self._autocast():
            world_model = self._world_model_phase(batch)
        with profile_range("## train/actor ##"), self._autocast():
            actor = self._actor_phase(world_model.out)
        with profile_range("## train/value ##"), self._autocast():
            value = self._value_phase(batch, world_model.out, actor.out)
        return {"world_model": world_model, "actor": actor, "value": value}

    def _update_body(self, batch: TensorDictBase) -> None:
        """The update itself: device work only, the same on every path. An update skipped as
        non-finite (any phase's) moves no weight, no optimiser state and no running average."""
        batch = self.prepare(batch)
        statistics = self._statistics()
        held = [t.clone() for t in statistics]  # a few scalars: put back where the update is skipped
        if self.joint_update:
            phases = self._forward(batch)
            stepped = self._step(self._phase_losses(phases), joint=True)
            self._after_value_step(self._skipped(stepped))
        else:
            with profile_range("## train/world_model ##"):
                with self._autocast():
                    world_model = self._world_model_phase(batch)
                # Stepped before the imagination, which runs on the updated world model.
                stepped = self._step({"world_model": self._weighted(world_model)})
            with profile_range("## train/actor ##"):
                with self._autocast():
                    actor = self._actor_phase(world_model.out)
            with profile_range("## train/value ##"):
                with self._autocast():
                    value = self._value_phase(batch, world_model.out, actor.out)
                phases = {"world_model": world_model, "actor": actor, "value": value}
                self._check_loss_names(phases)
                # One backward for both: they share no parameter (each holds the other's
                # network out) and the value loss reads the rollout detached, so each
                # gets exactly the gradients a backward of its own would give. V3's
                # REINFORCE value loss reads critic logits the actor phase computed
                # (OneCriticPassDreamerV3ActorLoss): inside one compiled graph, which
                # only a single backward may run.
                stepped.update(self._step({"actor": self._weighted(actor), "value": self._weighted(value)}))
                self._after_value_step(self._skipped(stepped))
        skipped = self._skipped(stepped)
        for statistic, before in zip(statistics, held):
            statistic.copy_(torch.where(skipped > 0, before, statistic))
        self._record(phases, stepped)

    @staticmethod
    def _skipped(stepped: dict[str, tuple]) -> torch.Tensor:
        """1. where any phase's step was skipped as non-finite (a device scalar)."""
        return torch.stack([found for _, found in stepped.values()]).amax()

    def _record(self, phases: dict[str, PhaseOut], stepped: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """The update's metrics, by name, into the running sums; its non-finite flags."""
        named = {name: loss.detach() for phase in phases.values() for name, loss in phase.losses.items()}
        for phase in phases.values():
            named.update(phase.metrics)
        named.update({f"grad_norm_{name}": norm for name, (norm, _) in stepped.items()})
        assert set(named) == set(self.METRIC_NAMES), (sorted(named), sorted(self.METRIC_NAMES))
        self.metrics.accumulate(torch.stack([named[name].reshape(()).float() for name in self.METRIC_NAMES]))
        self.nonfinite.observe(torch.stack([stepped[phase][1] for phase in PHASES]))

    def _step(self, losses: dict[str, torch.Tensor], *, joint: bool = False) -> dict[str, tuple]:
        """One backward over ``losses`` (phase name -> loss), then per phase: gradient
        sync, grad norm (and clip), step; a non-finite gradient norm skips that phase's
        step on the device (``joint``: every phase's step), the way ``nonfinite_policy``
        does it. Returns phase -> (grad norm, found_inf 0./1.). One range name for every
        phase, so a trace sums the optimisation work."""
        with profile_range("## train/optim ##"):
            for name in losses:
                self._clear_grads(self.params[name])
            # One backward of the sum (the same gradients as torch.autograd.backward over the
            # list, which dynamo does not trace; Tensor.backward it does).
            sum(losses.values()).backward()
            norms = {}
            for name in losses:
                if self.grad_sync is not None:
                    self.grad_sync(self.params[name])
                norms[name] = self._grad_norm(self.params[name])
            found = {name: (~torch.isfinite(norm)).float() for name, norm in norms.items()}
            if joint:  # one update: skipped whole where any of it is non-finite
                anywhere = torch.stack(list(found.values())).amax()
                found = dict.fromkeys(found, anywhere)
            for name in losses:
                self.nonfinite_policy.step(self.optimizers[name], self.params[name], found[name])
        return {name: (norms[name], found[name]) for name in losses}

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
        self.set_capturable(self.update_path is UpdatePath.CAPTURED)
        if self._grads_in_place:
            # A compiled whole update traced with every parameter's optimiser state in
            # place (a checkpoint from before some first step lacks some).
            self._init_optimizer_state()
        self.path.state_loaded()

    def _extra_state(self) -> dict:
        return {}

    def _load_extra_state(self, state: dict) -> None:
        pass

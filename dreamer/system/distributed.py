"""Data-parallel learners under ``torchrun``: one process per GPU (or CPU slot),
each with its own collector group and replay buffer; gradients are averaged
across ranks before every optimiser step, so the weights stay identical.
Rank 0 alone logs, evaluates and checkpoints.

Why an explicit gradient all-reduce rather than DDP-wrapped modules: the
learner makes two backward passes per update (the world model's, then the
actor's and value's together) with three optimisers, and the world model's modules run inside TorchRL's
DreamerModelLoss and again inside DreamerActorLoss's imagination rollout.
DDP's reducer expects one forward and one backward per wrapped module and
iteration; here a module takes part in several backward passes whose
gradients are partly discarded. Averaging each phase's gradients (one
flattened all-reduce per phase) is exact and keeps compile untouched: the
compiled losses never see a DDP wrapper, so there is no compile-vs-DDP order
to get wrong.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping, MutableMapping

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from dreamer.config import DistributedConfig
from dreamer.errors import UserError

log = logging.getLogger("dreamer")


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1  # ranks on this node (they share its cores)

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def export_scheduler_ranks(environ: MutableMapping[str, str]) -> bool:
    """A submitit job of several tasks (``hydra/launcher=slurm`` or ``submitit_local``
    with ``tasks_per_node`` > 1 or ``nodes`` > 1) is one data-parallel run: put its
    ranks, master address and port into ``environ`` as torchrun would (submitit's
    TorchDistributedEnvironment), so every task joins the same process group.
    Returns whether it did; torchrun's own variables win. Called once, at the entry point.
    """
    if "RANK" in environ or "SUBMITIT_EXECUTOR" not in environ:
        return False
    import submitit

    if submitit.JobEnvironment().num_tasks <= 1:
        return False
    dist_env = submitit.helpers.TorchDistributedEnvironment()
    # Each rank keeps every GPU visible and takes cuda:LOCAL_RANK (rank_device).
    environ.update({
        "MASTER_ADDR": dist_env.master_addr, "MASTER_PORT": str(dist_env.master_port),
        "RANK": str(dist_env.rank), "WORLD_SIZE": str(dist_env.world_size),
        "LOCAL_RANK": str(dist_env.local_rank), "LOCAL_WORLD_SIZE": str(dist_env.local_world_size),
    })
    return True


def ranks_from_env(environ: Mapping[str, str]) -> Ranks:
    """torchrun's RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE (read once, at the entry point)."""
    return Ranks(
        int(environ.get("RANK", 0)), int(environ.get("WORLD_SIZE", 1)), int(environ.get("LOCAL_RANK", 0)),
        int(environ.get("LOCAL_WORLD_SIZE", 1)),
    )


def setup(distributed_cfg: DistributedConfig, device: str, ranks: Ranks) -> None:
    """Join the process group (torchrun's env:// rendezvous); ``device`` as configured."""
    if not ranks.enabled:
        return
    backend = distributed_cfg.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() and device != "cpu" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(ranks.local_rank)
    dist.init_process_group(backend=backend)
    if not ranks.is_main:
        # One voice in the shared run log.
        log.setLevel(logging.WARNING)
    log.info("distributed: %d ranks, backend=%s", ranks.world_size, backend)


def teardown(ranks: Ranks) -> None:
    if ranks.enabled and dist.is_initialized():
        dist.destroy_process_group()


def rank_device(device: torch.device, ranks: Ranks) -> torch.device:
    """Each rank its own GPU (cuda -> cuda:LOCAL_RANK); a fixed cuda:N would put
    every rank on one GPU, so it is refused."""
    if ranks.enabled and device.type == "cuda":
        if device.index is not None:
            raise UserError(
                f"device={device} with {ranks.world_size} ranks would put every rank on one GPU: set "
                "device=cuda (each rank takes cuda:LOCAL_RANK; choose GPUs with CUDA_VISIBLE_DEVICES)"
            )
        return torch.device("cuda", ranks.local_rank)
    return device


class GradientAverager:
    """Called after each backward with that phase's parameters: averages their
    gradients over the ranks in one flattened all-reduce."""

    def __init__(self, world_size: int):
        self.world_size = world_size

    def __call__(self, params: list[torch.Tensor]) -> None:
        for p in params:
            if p.grad is None:  # every rank must contribute the same buffer layout
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params]
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat)
        flat.div_(self.world_size)
        for grad, averaged in zip(grads, _unflatten_dense_tensors(flat, grads)):
            grad.copy_(averaged)


def broadcast_module(module: torch.nn.Module) -> None:
    """Rank 0's parameters and buffers everywhere (start and resume)."""
    for tensor in list(module.parameters()) + list(module.buffers()):
        dist.broadcast(tensor.data, src=0)


def cpu_group() -> dist.ProcessGroup | None:
    """A process group that reduces CPU tensors: the default one under gloo, a gloo
    twin under nccl. Control votes go through it, so they never touch the GPU (an
    H2D copy, an NCCL launch and a D2H read would stall every update)."""
    if dist.get_backend() == "gloo":
        return None
    return dist.new_group(backend="gloo")


def max_over_ranks(value: int, group: dist.ProcessGroup | None = None) -> int:
    """The largest ``value`` over all ranks, on every rank (e.g. a stop reason code),
    reduced in host memory over ``group`` (see :func:`cpu_group`)."""
    reduced = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(reduced, op=dist.ReduceOp.MAX, group=group)
    return int(reduced[0])


def max_divergence(module: torch.nn.Module) -> float:
    """Largest |parameter - rank 0's| over all ranks (0.0: in lockstep)."""
    flat = torch.cat([p.detach().reshape(-1).float() for p in module.parameters()])
    reference = flat.clone()
    dist.broadcast(reference, src=0)
    gap = (flat - reference).abs().max()
    dist.all_reduce(gap, op=dist.ReduceOp.MAX)
    return float(gap)

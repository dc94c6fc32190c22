"""Replay buffer: uint8 steps in (pinned) host storage, sequences out on the learner device.

Write: the collector batch, reduced to the keys the learner reads (a view, no
copy), goes into the storage slice through ``torchrl_ext.SliceCursorWriter``
(one direct stack / copy). Each frame is stored once: ``("next", obs)`` only,
never the root observation that duplicates it.

Sample: ``SliceSampler`` draws ``batch_size`` sequences of ``batch_length``
steps inside single trajectories; a background thread prefetches them and
casts them to the learner's device (non-blocking from pinned memory).
"""

from __future__ import annotations

import copy
import functools

import psutil
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import LazyTensorStorage, SliceSampler, TensorDictReplayBuffer

from dreamer.config import BufferConfig
from dreamer.errors import UserError
from torchrl_ext import PinnedLazyTensorStorage, PlainWriteReplayBuffer, SliceCursorWriter

TRAJ_KEY = ("collector", "traj_ids")


def stored_keys(obs_key: str) -> list:
    return [
        ("next", obs_key),
        "action",
        ("next", "reward"),
        ("next", "done"),
        ("next", "terminated"),
        ("next", "truncated"),
        TRAJ_KEY,
        "step_count",
    ]


def use_pinned_memory(buffer_cfg: BufferConfig, device: torch.device) -> bool:
    choice = buffer_cfg.pin_memory
    if choice == "on" and not torch.cuda.is_available():
        raise UserError("buffer.pin_memory=on needs CUDA; use buffer.pin_memory=auto or off")
    return choice == "on" or (choice == "auto" and device.type == "cuda")


def _to_device(batch: TensorDictBase, device: torch.device, pin: bool) -> TensorDictBase:
    # Runs in the prefetch thread: the gather result is pageable, so pin it
    # there (off the learner's path) to make the copy truly asynchronous.
    if pin:
        batch = batch.pin_memory()
    return batch.to(device, non_blocking=pin)


def make_replay_buffer(buffer_cfg: BufferConfig, device: torch.device) -> TensorDictReplayBuffer:
    b = buffer_cfg
    pin = use_pinned_memory(b, device)
    storage = (
        PinnedLazyTensorStorage(b.capacity, pin_memory=True) if pin else LazyTensorStorage(b.capacity)
    )
    sampler = SliceSampler(
        slice_len=b.batch_length,
        traj_key=TRAJ_KEY,
        strict_length=True,  # only whole sequences: the learner reshapes to (B, T)
        cache_values=False,
    )
    transform = None
    if device.type != "cpu":
        transform = functools.partial(_to_device, device=device, pin=pin)
    return PlainWriteReplayBuffer(
        storage=storage,
        sampler=sampler,
        writer=SliceCursorWriter(),
        batch_size=b.batch_size * b.batch_length,
        prefetch=b.prefetch or None,
        transform=transform,
    )


def write(buffer: TensorDictReplayBuffer, batch: TensorDictBase, obs_key: str) -> int:
    """Store a collector batch (any leading shape); returns the steps written."""
    steps = batch.select(*stored_keys(obs_key), strict=False)
    if steps.ndim > 1:
        steps = steps.reshape(-1)
    buffer.extend(steps)
    return steps.shape[0]


def bytes_per_step(step: TensorDictBase, obs_key: str) -> int:
    kept = step.select(*stored_keys(obs_key), strict=False)
    return sum(t.element_size() * t.numel() for t in kept.values(True, True))


def check_capacity(buffer_cfg: BufferConfig, step_bytes: int) -> int:
    """Refuse a buffer that cannot fit in free RAM; returns the bytes it will use."""
    need = buffer_cfg.capacity * step_bytes
    free = psutil.virtual_memory().available
    if need > 0.8 * free:
        fit = int(0.8 * free / step_bytes)
        raise UserError(
            f"buffer.capacity={buffer_cfg.capacity} needs {need / 2**30:.1f} GiB but only "
            f"{free / 2**30:.1f} GiB is free: set buffer.capacity<={fit}"
        )
    return need


def replay_state(buffer: TensorDictReplayBuffer) -> dict:
    """The buffer's state as tensors and plain types (checkpoints load with
    ``weights_only=True``): upstream's state keeps the prefetched batches as
    TensorDicts, stored here as plain nested dicts."""
    return _plain(buffer.state_dict())


def load_replay_state(buffer: TensorDictReplayBuffer, state: dict) -> None:
    buffer.load_state_dict(_tensordicts(state))


_TD_MARK = "__tensordict__"


def _map_tree(value, leaf):
    """``leaf`` applied through dicts, lists and tuples. A container is rebuilt only
    when something inside it changed, and as a shallow copy: the storage's
    OrderedDict carries its batch size in a ``_metadata`` attribute."""
    done = leaf(value)
    if done is not value:
        return done
    if isinstance(value, dict):
        items = {k: _map_tree(v, leaf) for k, v in value.items()}
        if all(items[k] is value[k] for k in value):
            return value
        out = copy.copy(value)
        out.update(items)
        return out
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        items = [_map_tree(v, leaf) for v in value]
        return value if all(a is b for a, b in zip(items, value)) else type(value)(items)
    return value


def _plain(value):
    def leaf(v):
        if isinstance(v, TensorDictBase):
            return {_TD_MARK: v.to_dict(), "batch_size": list(v.batch_size)}
        return v
    return _map_tree(value, leaf)


def _tensordicts(value):
    def leaf(v):
        if isinstance(v, dict) and _TD_MARK in v:
            return TensorDict(v[_TD_MARK], batch_size=v["batch_size"])
        return v
    return _map_tree(value, leaf)

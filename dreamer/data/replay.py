"""Replay buffer: uint8 steps in (pinned) host storage, sequences out on the learner device.

Write: the collector batch, reduced to the keys the learner reads (a view, no
copy), goes into the storage slice through ``torchrl_ext.SliceCursorWriter``
(one direct stack / copy). Each frame is stored once: ``("next", obs)`` only,
never the root observation that duplicates it.

Sample: ``SliceSampler`` draws ``batch_size`` sequences of ``batch_length``
steps inside single trajectories; a background thread prefetches them. For a
learner on another device (a GPU) the sequences are gathered straight into
reused host staging batches (page-locked when pinned) and copied on a side CUDA
stream that the learner's stream waits on (``torchrl_ext.StagedDeviceReplayBuffer``).
On a CPU learner the sample is the gather itself, as upstream's.

Pinned storage is page-locked exactly (``torchrl_ext.page_locked_like``), not
rounded up to a power of two by torch's caching host allocator: the bytes
:func:`check_capacity` counts are the bytes locked.
"""

from __future__ import annotations

import contextlib
import copy
import re

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import LazyTensorStorage, SliceSampler, TensorDictReplayBuffer

from dreamer.config import BufferConfig
from dreamer.errors import UserError
from dreamer.system.memory import host_memory_available
from torchrl_ext import (
    PinnedLazyTensorStorage,
    PlainWriteReplayBuffer,
    SliceCursorWriter,
    StagedDeviceReplayBuffer,
    filled_storage_state,
    load_filled_storage_state,
)

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


def make_replay_buffer(buffer_cfg: BufferConfig, device: torch.device) -> TensorDictReplayBuffer:
    """Host storage; samples come out on ``device`` (the learner's)."""
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
    common = dict(
        storage=storage,
        sampler=sampler,
        writer=SliceCursorWriter(),
        batch_size=b.batch_size * b.batch_length,
        prefetch=b.prefetch or None,
    )
    if device.type != "cpu":
        return StagedDeviceReplayBuffer(device=device, pin_memory=pin, **common)
    return PlainWriteReplayBuffer(**common)


def write(buffer: TensorDictReplayBuffer, batch: TensorDictBase, obs_key: str) -> int:
    """Store a collector batch (any leading shape); returns the steps written."""
    steps = batch.select(*stored_keys(obs_key), strict=False)
    if steps.ndim > 1:
        steps = steps.reshape(-1)
    buffer.extend(steps)
    return steps.shape[0]


# What SliceSampler raises when no stored trajectory is as long as the sequences it must cut.
_NO_LONG_ENOUGH_TRAJECTORY = "Did not find a single trajectory with sufficient length"


@contextlib.contextmanager
def explain_short_episodes(batch_length: int):
    """SliceSampler's failure on episodes shorter than the sequences, as one line saying what to change."""
    try:
        yield
    except RuntimeError as err:
        if _NO_LONG_ENOUGH_TRAJECTORY not in str(err):
            raise
        longest = re.search(r"length range: \d+ - (\d+)", str(err))
        seen = f" (the longest holds {longest.group(1)} steps)" if longest else ""
        raise UserError(
            f"no episode in the replay is as long as buffer.batch_length={batch_length} agent steps{seen}: the env "
            "ends its episodes sooner; set buffer.batch_length shorter than its episodes"
        ) from None


def bytes_per_step(step: TensorDictBase, obs_key: str) -> int:
    kept = step.select(*stored_keys(obs_key), strict=False)
    return sum(t.element_size() * t.numel() for t in kept.values(True, True))


def check_capacity(buffer_cfg: BufferConfig, step_bytes: int, *, ranks_per_node: int = 1,
                   storage_device: torch.device = torch.device("cpu")) -> int:
    """Refuse, in one line, a replay buffer that does not fit; returns the bytes it will use.

    Host storage: every learner process on this node (``ranks_per_node``) holds its
    own buffer, against the host memory available to this process (free RAM, or
    less under a cgroup memory limit). Storage on a GPU: against that GPU's free
    memory. 80% of either at most, leaving room for the rest of the run.
    """
    need = buffer_cfg.capacity * step_bytes
    if storage_device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(storage_device)
        if need > 0.8 * free:
            fit = int(0.8 * free / step_bytes)
            raise UserError(
                f"buffer.capacity={buffer_cfg.capacity} needs {need / 2**30:.1f} GiB on {storage_device} "
                f"but only {free / 2**30:.1f} GiB of its memory is free: set buffer.capacity<={fit}"
            )
        return need
    available, limited_by = host_memory_available()
    node_need = need * ranks_per_node
    if node_need > 0.8 * available:
        fit = int(0.8 * available / ranks_per_node / step_bytes)
        per_node = (f" per learner x {ranks_per_node} learners on this node = {node_need / 2**30:.1f} GiB"
                    if ranks_per_node > 1 else "")
        raise UserError(
            f"buffer.capacity={buffer_cfg.capacity} needs {need / 2**30:.1f} GiB{per_node} but only "
            f"{available / 2**30:.1f} GiB is available ({limited_by}): set buffer.capacity<={fit}"
        )
    return need


def replay_state(buffer: TensorDictReplayBuffer) -> dict:
    """The buffer's state as tensors and plain types (checkpoints load with
    ``weights_only=True``): upstream's state keeps the prefetched batches as
    TensorDicts, stored here as plain nested dicts. Only the rows written so far
    are saved (torchrl_ext.storage_state): a checkpoint grows with the buffer's
    fill, not its capacity, and costs no copy of the data."""
    state = buffer.state_dict()
    state["_storage"] = filled_storage_state(buffer._storage)
    return _plain(state)


def load_replay_state(buffer: TensorDictReplayBuffer, state: dict) -> None:
    state = _tensordicts(state)
    state["_storage"] = load_filled_storage_state(buffer._storage, state["_storage"])
    buffer.load_state_dict(state)


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

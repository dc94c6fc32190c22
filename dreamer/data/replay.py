"""Replay buffer: uint8 steps in (pinned) host storage, sequences out on the learner device.

What is stored: one record per observation, as DreamerV3's reference stores them.
A collector batch holds transitions (action t, then ``("next", obs)`` t + 1, its
reward and flags); each becomes one record, and each episode's first observation
(the reset's, the root observation where ``step_count`` is 0) gets a record of its
own before them: ``is_first`` set, no action (zeros), reward 0, not done. Each frame
is stored once: the reset's root observation in its record, every later one as
``("next", obs)``; no other root observation is kept.

Streams: the records of one env (a collector worker) form its stream, episodes one
after another. ``torchrl_ext.StreamStepWriter`` numbers each stream's records and
writes the batch into the storage slice (one direct stack / copy);
``torchrl_ext.StreamSliceSampler`` draws ``batch_size`` windows of ``batch_length``
consecutive records of one stream, starting at any record with equal probability,
across episode ends (the learner's RSSM resets at ``is_first``), never across two
streams or the ring's write cursor. A background thread prefetches them.

For a learner on another device (a GPU) the sequences are gathered straight into
reused host staging batches (page-locked when pinned) and copied on a side CUDA
stream that the learner's stream waits on (``torchrl_ext.StagedDeviceReplayBuffer``).
On a CPU learner the sample is the gather itself, as upstream's.

Pinned storage is page-locked exactly (``torchrl_ext.page_locked_like``), not
rounded up to a power of two by torch's caching host allocator: the bytes
:func:`check_capacity` counts are the bytes locked.
"""

from __future__ import annotations

import copy

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

from dreamer.config import BufferConfig
from dreamer.envs.keys import IS_FIRST
from dreamer.errors import UserError
from dreamer.system.memory import host_memory_available
from torchrl_ext import (
    WORKER_KEY,
    PinnedLazyTensorStorage,
    PlainWriteReplayBuffer,
    StagedDeviceReplayBuffer,
    StreamSliceSampler,
    StreamStepWriter,
    filled_storage_state,
    load_filled_storage_state,
)

STREAM_KEY = ("collector", "stream")  # which env's stream the record belongs to
STEP_KEY = ("collector", "step")  # the record's place in its stream (StreamStepWriter)
# What a transition contributes to its record (the reset record fills the same keys).
FLAG_KEYS = (("next", "done"), ("next", "terminated"), ("next", "truncated"))


def stored_keys(obs_key: str) -> list:
    return [("next", obs_key), "action", ("next", "reward"), *FLAG_KEYS, IS_FIRST, STREAM_KEY, STEP_KEY]


def use_pinned_memory(buffer_cfg: BufferConfig, device: torch.device) -> bool:
    choice = buffer_cfg.pin_memory
    if choice == "on" and not torch.cuda.is_available():
        raise UserError("buffer.pin_memory=on needs CUDA; use buffer.pin_memory=auto or off")
    return choice == "on" or (choice == "auto" and device.type == "cuda")


def make_replay_buffer(buffer_cfg: BufferConfig, device: torch.device, seed: int = 0) -> TensorDictReplayBuffer:
    """Host storage; samples come out on ``device`` (the learner's), drawn from the buffer's
    own generator (seeded with ``seed``, saved with the buffer): a resumed run samples the
    sequences the stopped one would have."""
    b = buffer_cfg
    pin = use_pinned_memory(b, device)
    storage = (
        PinnedLazyTensorStorage(b.capacity, pin_memory=True) if pin else LazyTensorStorage(b.capacity)
    )
    common = dict(
        storage=storage,
        sampler=StreamSliceSampler(slice_len=b.batch_length, stream_key=STREAM_KEY, step_key=STEP_KEY),
        writer=StreamStepWriter(stream_key=STREAM_KEY, step_key=STEP_KEY),
        batch_size=b.batch_size * b.batch_length,  # one update's records (TrainRatio.replayed_per_update)
        generator=torch.Generator().manual_seed(seed),
        prefetch=b.prefetch or None,
    )
    if device.type != "cpu":
        return StagedDeviceReplayBuffer(device=device, pin_memory=pin, **common)
    return PlainWriteReplayBuffer(**common)


def records(batch: TensorDictBase, obs_key: str, stream: int) -> TensorDictBase:
    """One env's (N,) transitions -> its records: a reset record before each episode's
    first transition, then one record per transition (see the module docstring)."""
    steps = batch.select(("next", obs_key), "action", ("next", "reward"), *FLAG_KEYS, strict=False)
    kept = list(steps.keys(include_nested=True, leaves_only=True))
    n = steps.shape[0]
    step_count = batch.get("step_count", None)  # absent: no episode starts here
    starts = torch.zeros(n, dtype=torch.bool) if step_count is None else step_count.reshape(n) == 0
    resets = int(starts.sum())
    if resets == 0:
        out = steps.clone(False)  # a new container over the same tensors: keys are added below
    else:
        # Transition t lands after the reset records of every episode started at or before it.
        into = torch.arange(n) + torch.cumsum(starts, 0)
        out = TensorDict(
            {key: torch.zeros(n + resets, *steps.get(key).shape[1:], dtype=steps.get(key).dtype)
             for key in kept},
            batch_size=[n + resets],
        )
        out[into] = steps
        if ("next", obs_key) in kept:
            out.get(("next", obs_key))[into[starts] - 1] = batch.get(obs_key)[starts]
    first = torch.zeros(n + resets, 1, dtype=torch.bool)
    if resets:
        first[into[starts] - 1] = True
    out.set(IS_FIRST, first)
    out.set(STREAM_KEY, torch.full((n + resets,), stream, dtype=torch.long))
    out.set(STEP_KEY, torch.zeros(n + resets, dtype=torch.long))  # numbered by the writer
    return out


def write(buffer: TensorDictReplayBuffer, batch: TensorDictBase, obs_key: str) -> int:
    """Store a collector batch of transitions; returns the agent steps it held.

    A batch of shape (N,) is one env's: its stream is the collector worker that
    collected it (``torchrl_ext.WORKER_KEY``, stream 0 when collected in this
    process). A (E, N) batch holds E envs' streams, stream e per row."""
    if batch.ndim == 1:
        streams = [(batch, _stream_of(batch, 0))]
    else:
        rows = batch.reshape(-1, batch.shape[-1])
        streams = [(row, _stream_of(row, e)) for e, row in enumerate(rows.unbind(0))]
    for steps, stream in streams:
        buffer.extend(records(steps, obs_key, stream))
    return batch.numel()


def _stream_of(batch: TensorDictBase, default: int) -> int:
    worker = batch.get(WORKER_KEY, None)
    return default if worker is None else int(worker.reshape(-1)[0])


def bytes_per_step(step: TensorDictBase, obs_key: str) -> int:
    """What one record of ``step`` (a collector step, or a rollout's first) takes in the storage."""
    one = step.reshape(-1)[:1]  # a step, or a rollout of one
    record = records(one.exclude("step_count"), obs_key, stream=0)[0]
    return sum(t.element_size() * t.numel() for t in record.values(True, True))


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

"""Replay-buffer write and sample paths: contiguous writes as storage slices, page-locked
host storage, samples gathered into reused staging batches and copied on a side stream.

Upstream ``TensorStorage.set`` already writes a ``LazyStackedTensorDict`` with
one ``_stack_onto_`` into ``storage[cursor]`` -- but only when ``cursor`` is a
``slice``. ``RoundRobinWriter.extend`` always passes a tensor of indices, so
that path is never taken: lazy stacks go through ``update_at_`` and lists of
tensordicts are stacked into a temporary and then copied (two passes over the
data). :class:`SliceCursorWriter` hands the storage slices instead (two at the
ring's wrap-around), so every contiguous write is a single direct stack for
lazy stacks and lists, and a single copy for dense batches.
"""

from __future__ import annotations

import collections
import copy
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, runtime_checkable

import torch
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase, is_tensor_collection
from tensordict.utils import expand_as_right
from torchrl.data import ReplayBuffer, TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import PrioritizedSampler
from torchrl.data.replay_buffers.storages import LazyTensorStorage, TensorStorage
from torchrl.data.replay_buffers.writers import RoundRobinWriter
from torchrl.envs.transforms._base import _CallableTransform

from torchrl_ext.host_memory import page_locked_like
from torchrl_ext.intra_op import use_one_intra_op_thread


class SliceCursorWriter(RoundRobinWriter):
    """A :class:`~torchrl.data.RoundRobinWriter` that writes through storage slices.

    Same cursor, write count and returned indices as the parent; only the
    cursor handed to ``storage.set`` differs. Falls back to the parent for
    writes larger than the storage and for non-tensordict data.
    """

    def extend(self, data) -> torch.Tensor:
        if isinstance(data, list) and data and is_tensor_collection(data[0]):
            # A list of per-step tensordicts: view it as a lazy stack, no copy.
            data = LazyStackedTensorDict.lazy_stack(data, dim=0)
        if not is_tensor_collection(data) or self._storage.ndim != 1:
            return super().extend(data)
        n = data.shape[0]
        capacity = self._storage._max_size_along_dim0(batched_data=data)
        if n == 0 or n > capacity:
            return super().extend(data)
        start = self._cursor
        head = min(n, capacity - start)
        index = torch.arange(start, start + n, dtype=torch.long) % capacity
        # Move the cursor first, as upstream does, so concurrent writers don't overlap.
        self._cursor = (start + n) % capacity
        self._write_count += n
        self._storage.set(slice(start, start + head), _rows(data, 0, head))
        if head < n:
            self._storage.set(slice(0, n - head), _rows(data, head, n))
        self._bump_generation(index, data)
        index = self._replicate_index(index)
        self._mark_update_entities(index)
        return index


def _rows(data: TensorDictBase, start: int, stop: int) -> TensorDictBase:
    """Rows [start, stop) without materialising a lazy stack."""
    if start == 0 and stop == data.shape[0]:
        return data
    if isinstance(data, LazyStackedTensorDict) and data.stack_dim == 0:
        return LazyStackedTensorDict.lazy_stack(data.tensordicts[start:stop], dim=0)
    return data[start:stop]


class PinnedLazyTensorStorage(LazyTensorStorage):
    """A :class:`~torchrl.data.LazyTensorStorage` allocated in page-locked host memory.

    Pinned pages let ``.to(cuda, non_blocking=True)`` copy asynchronously.
    The storage is allocated page-locked at the first write
    (:func:`~torchrl_ext.host_memory.page_locked_like`: exactly the bytes it
    needs, no pageable twin, none of ``pin_memory()``'s power-of-two rounding);
    a loaded state is copied into page-locked memory too. Pinning needs a CUDA
    driver, so ``pin_memory=True`` on a machine without CUDA raises at
    construction rather than at the first write.
    """

    def __init__(self, *args, pin_memory: bool = True, **kwargs):
        if pin_memory and not torch.cuda.is_available():
            raise RuntimeError("pin_memory=True needs CUDA; pass pin_memory=False on this machine")
        super().__init__(*args, **kwargs)
        self.pin_memory = pin_memory

    def _init(self, data) -> None:
        if not self.pin_memory or self.ndim != 1 or self.shared_init or not is_tensor_collection(data):
            return super()._init(data)
        # ``data`` is one step (batch shape ()): the storage is capacity of them.
        self._storage = page_locked_like(data.expand(self.max_size))
        self.initialized = True

    def load_state_dict(self, state_dict) -> None:
        saved = state_dict["_storage"]
        if self.pin_memory and self._storage is None and isinstance(saved, (dict, OrderedDict)):
            # Upstream would clone the saved tensors into pageable memory; give it
            # page-locked ones of the same layout to copy into instead.
            layout = TensorDict().load_state_dict(copy.copy(saved), strict=False)  # references, no copy
            self._storage = page_locked_like(layout)
        super().load_state_dict(state_dict)


class PlainWriteReplayBuffer(TensorDictReplayBuffer):
    """A :class:`~torchrl.data.TensorDictReplayBuffer` whose ``extend`` goes straight
    to the writer when nothing needs the written data back.

    Upstream ``extend`` always runs ``transform.inv`` (which shallow-clones the
    data even for an empty ``Compose``) and then writes an ``"index"`` entry into
    that clone, for priority updates. For a lazy stack of K steps both are per-step
    Python work (K clones, K index writes): about half of a 128-step write. With no
    transform whose inverse changes the data (none, or only sample-side callables
    such as the move to a GPU learner) and no prioritized sampler neither has any
    effect, so this buffer skips them; otherwise it is upstream's ``extend`` unchanged.

    It prefetches on one thread, which runs its torch ops on one intra-op thread
    (:func:`~torchrl_ext.intra_op.use_one_intra_op_thread`: sampling a large storage
    in parallel there slowed the learner's own parallel ops). One thread draws the
    prefetched batches in the order they are asked for: with the buffer's own
    generator (``generator=``), the same sequences every time, and after a
    ``load_state_dict`` the ones the saved buffer would have drawn (upstream's pool
    of ``prefetch`` threads draws them in whichever order its threads run).
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if self._prefetch_cap:
            # Upstream's pool has started no thread yet (threads start on the first submit).
            self._prefetch_executor.shutdown(wait=False)
            self._prefetch_executor = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="replay-prefetch", initializer=use_one_intra_op_thread,
            )

    def extend(self, tensordicts: TensorDictBase, *, update_priority: bool | None = None) -> torch.Tensor:
        if self._delayed_init and not self.initialized:
            self._init()
        if (
            isinstance(tensordicts, TensorDictBase)
            and _inverse_is_identity(self._transform)
            and not isinstance(self._sampler, PrioritizedSampler)
        ):
            return self._extend(tensordicts)
        return super().extend(tensordicts, update_priority=update_priority)


def _inverse_is_identity(transform) -> bool:
    """No transform, or only plain callables (what ``transform=fn`` becomes: applied to
    sampled data, their inverse returns written data as it is, e.g. a move to the
    learner's device). A real :class:`~torchrl.envs.Transform` may change what is written."""
    if transform is None:
        return True
    return all(isinstance(t, _CallableTransform) for t in getattr(transform, "transforms", [transform]))


@runtime_checkable
class DeliversSamplesInto(Protocol):
    """A replay buffer that can copy every later sample into a fixed tensordict (a
    captured CUDA graph's static inputs) instead of handing out new batches."""

    def deliver_into(self, destination: TensorDictBase | None) -> None:
        """Copy later samples into ``destination`` and hand it out; None: new batches again."""


READY_EVENT = "staged_copy_ready"  # info key: the event a sample's device copy records
STAGED_SLOT = "staged_slot"  # info key: a staged host batch the caller still copies (deliver_into)


class StagedDeviceReplayBuffer(PlainWriteReplayBuffer):
    """A :class:`PlainWriteReplayBuffer` whose samples come out on ``device``, gathered
    into reused host staging batches and copied on a side CUDA stream.

    Upstream gathers each sample into freshly allocated (pageable) memory; a
    ``.to(device)`` transform then copies it on the sampling thread's current
    stream, and pinning it first is one more copy. Here each sample is gathered
    (``index_select`` with ``out=``) straight into one of ``prefetch + 1`` (at
    least 2) preallocated host batches, page-locked when ``pin_memory``, so
    every prefetch thread and the caller can gather at once. On CUDA the batch is
    copied to ``device`` with ``non_blocking=True`` on a side stream, and an
    event is recorded after the copy:

    - :meth:`sample` makes the caller's current stream wait on it (no host
      wait), and marks the device tensors as used on that stream
      (``record_stream``), so the caching allocator does not give their memory
      back to the side stream while the caller's kernels may still read it;
    - the next gather into that staging batch first waits for it on the host
      (``Event.synchronize``, in the gathering thread only), so a staging batch
      is never overwritten while a copy still reads it.

    Off CUDA the staged batch is copied (cloned on the CPU) before it is handed
    out: a sample never aliases a staging batch. The sampled data and the info
    entries set into it are upstream ``TensorDictReplayBuffer.sample``'s.

    :meth:`deliver_into` gives samples a fixed home on the device instead (a
    captured CUDA graph's static inputs): the prefetch threads only gather, and
    :meth:`sample` copies the staged batch into that tensordict on the caller's
    current stream, after whatever the caller queued there before (the graph
    replay still reading the previous sample), and returns it: no other device
    copy, no allocation.
    Needs a 1-D tensordict :class:`~torchrl.data.TensorStorage`, no sample
    transform, no sample unit and no generation tracking.
    """

    def __init__(self, *, device: torch.device | str, pin_memory: bool, **kwargs):
        super().__init__(**kwargs)
        if self._transform is not None and len(self._transform):
            raise ValueError("StagedDeviceReplayBuffer takes no transform: it moves samples to `device` itself")
        if getattr(self, "_sample_unit", None) is not None or self._writer.tracks_generations:
            raise ValueError("StagedDeviceReplayBuffer supports neither sample units nor generation tracking")
        if not isinstance(self._storage, TensorStorage) or self._storage.ndim != 1:
            raise ValueError("StagedDeviceReplayBuffer needs a 1-D TensorStorage")
        self.device = torch.device(device)
        self.staging = StagingBatches(slots=max(2, self._prefetch_cap + 1), pin_memory=pin_memory)
        self._copy = SideStreamCopy(self.device)
        self.destination: TensorDictBase | None = None

    def deliver_into(self, destination: TensorDictBase | None) -> None:
        """Copy every later sample into ``destination`` (on ``device``, the layout of a
        sample) and hand out that tensordict; None: fresh device batches again."""
        self.destination = destination

    def _sample(self, batch_size: int) -> tuple[TensorDictBase, dict]:
        slot = self.staging.acquire()  # before the locks: its wait must not hold up writers
        ready = None
        deferred = self.destination is not None
        try:
            with self._replay_lock, self._write_lock:
                index, info = self._sampler.sample(self._storage, batch_size)
                info["index"] = index
                host = self.staging.gather(slot, self._storage._storage, index, info)
            if deferred:  # sample() copies it, on the caller's stream, and frees the slot
                info[STAGED_SLOT] = slot
                return host, info
            batch, ready = self._copy(host)
        except BaseException:
            deferred = False
            raise
        finally:
            if not deferred:
                self.staging.release(slot, ready)
        info[READY_EVENT] = ready
        return batch, info

    def sample(self, batch_size: int | None = None, return_info: bool = False):
        # The base class's sample (prefetch queue included): the info entries are
        # in the batch already, copied with it rather than one by one afterwards.
        batch, info = ReplayBuffer.sample(self, batch_size, return_info=True)
        batch = self._hand_over(batch, info)
        return (batch, info) if return_info else batch

    def _hand_over(self, batch: TensorDictBase, info: dict) -> TensorDictBase:
        """The sample on ``device``, ordered before the caller's next work; in
        ``destination`` when one is set."""
        slot, ready = info.pop(STAGED_SLOT, None), info.pop(READY_EVENT, None)
        destination = self.destination
        if ready is not None or batch.device == self.device:  # copied while sampled
            self._copy.hand_over(batch, ready)
            # Sampled before deliver_into was set: one copy on the device.
            return batch if destination is None else destination.update_(batch, non_blocking=True)
        # A host batch: staged for ``destination`` (slot), or restored from a checkpoint.
        if destination is None:
            device_batch, copied = self._copy(batch)
            self._copy.hand_over(device_batch, copied)
        else:
            device_batch = destination.update_(batch, non_blocking=True)
            copied = self._copy.record_on_caller()  # the staging slot is free once this copy ran
        if slot is not None:
            self.staging.release(slot, copied)
        return device_batch

    def _clone_prefetch_result(self, result):
        # A checkpoint clones the prefetched batches on the caller's stream: after
        # their copies. A staged host batch is cloned as it is (its slot stays with it).
        batch, info = result
        info = dict(info)
        info.pop(STAGED_SLOT, None)
        self._copy.hand_over(batch, info.pop(READY_EVENT, None))
        return super()._clone_prefetch_result((batch, info))

    def _clear_prefetch_queue_locked(self) -> None:
        # Prefetched host batches dropped unread give their staging slots back.
        futures = tuple(self._prefetch_queue)
        super()._clear_prefetch_queue_locked()
        for future in futures:
            if future.cancelled() or future.exception() is not None:
                continue
            slot = future.result()[1].get(STAGED_SLOT)
            if slot is not None:
                self.staging.release(slot, None)


class StagingBatches:
    """A few host batches that samples are gathered into, each reused once the
    device copy that last read it is done."""

    class Slot:
        def __init__(self):
            self.batch: TensorDictBase | None = None  # allocated at the first gather
            self.ready = None  # the event of the last copy out of it (None: nothing in flight)

    def __init__(self, slots: int, pin_memory: bool):
        self.pin_memory = pin_memory
        self.slots = [self.Slot() for _ in range(slots)]
        self._free = collections.deque(self.slots)  # oldest release first: its copy is likeliest done
        self._available = threading.Condition()

    def acquire(self) -> StagingBatches.Slot:
        with self._available:
            while not self._free:
                self._available.wait()
            slot = self._free.popleft()
        if slot.ready is not None:
            slot.ready.synchronize()
            slot.ready = None
        return slot

    def release(self, slot: StagingBatches.Slot, ready) -> None:
        slot.ready = ready
        with self._available:
            self._free.append(slot)
            self._available.notify()

    def gather(self, slot: StagingBatches.Slot, source: TensorDictBase, index, info: dict) -> TensorDictBase:
        """Rows ``index`` of ``source`` and the sampler's ``info`` entries, written into ``slot``."""
        rows = index[0] if isinstance(index, tuple) else index
        if slot.batch is None or slot.batch.shape[0] != rows.numel():
            # The first gather is upstream's (an allocating index); it fixes the layout.
            template = source[rows]
            _set_info(template, info, inplace=False)
            slot.batch = page_locked_like(template) if self.pin_memory else torch.empty_like(template)
            slot.batch.update_(template)
            return slot.batch
        for key, out in slot.batch.items(True, True):
            if key in info:
                continue
            torch.index_select(source.get(key), 0, rows, out=out)
        _set_info(slot.batch, info, inplace=True)
        return slot.batch


def _set_info(batch: TensorDictBase, info: dict, *, inplace: bool) -> None:
    """The sampler's info entries into ``batch``, as upstream ``TensorDictReplayBuffer.sample`` sets them."""
    for key, value in info.items():
        if key == "index" and isinstance(value, tuple):
            value = torch.stack(value, -1)
        value = torch.as_tensor(value)
        if value.ndim < batch.ndim:
            value = expand_as_right(value, batch)
        if inplace:
            batch.get(key).copy_(value)
        else:
            batch.set(key, value)


class SideStreamCopy:
    """Host batch -> ``device``: on CUDA a non-blocking copy on a side stream, with
    the event recorded after it; elsewhere a plain copy and no event."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def __call__(self, host: TensorDictBase):
        if self.stream is None:
            return (host.clone() if self.device.type == "cpu" else host.to(self.device)), None
        with torch.cuda.stream(self.stream):
            batch = host.to(self.device, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(self.stream)
        return batch, ready

    def record_on_caller(self):
        """An event after what the caller's current stream has queued (None off CUDA)."""
        if self.stream is None:
            return None
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def hand_over(self, batch: TensorDictBase, ready) -> None:
        """Order the caller's current stream after the copy (no host wait)."""
        if ready is None:
            return
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(ready)
        for tensor in batch.values(True, True):
            tensor.record_stream(consumer)

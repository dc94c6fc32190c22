"""Replay-buffer write path: contiguous writes as storage slices, pinned host storage.

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

import torch
from tensordict import LazyStackedTensorDict, TensorDictBase, is_tensor_collection
from torchrl.data import TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import PrioritizedSampler
from torchrl.data.replay_buffers.storages import LazyTensorStorage
from torchrl.data.replay_buffers.writers import RoundRobinWriter
from torchrl.envs.transforms._base import _CallableTransform


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
    Pinning needs a CUDA driver, so ``pin_memory=True`` on a machine without
    CUDA raises at construction rather than at the first write.
    """

    def __init__(self, *args, pin_memory: bool = True, **kwargs):
        if pin_memory and not torch.cuda.is_available():
            raise RuntimeError("pin_memory=True needs CUDA; pass pin_memory=False on this machine")
        super().__init__(*args, **kwargs)
        self.pin_memory = pin_memory

    def _init(self, data) -> None:
        super()._init(data)
        if self.pin_memory and is_tensor_collection(self._storage):
            # Allocated once at the first write; pin_memory() copies, so the
            # unpinned twin is freed right after.
            self._storage = self._storage.pin_memory()


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
    """

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

"""A tensor storage's state dict holding only the rows written so far.

``TensorStorage.state_dict()`` holds the whole preallocated storage, so a
checkpoint of a buffer filled to 10% is as large as a full one. Slicing the
tensors does not help: ``torch.save`` writes a tensor's whole underlying
storage. :func:`filled_storage_state` gives each tensor a view of its first
``len(storage)`` rows over an untyped storage of exactly their bytes (shared
memory, no copy), so ``torch.save`` writes those rows only.
:func:`load_filled_storage_state` allocates the full storage (through the
storage's own ``_init``, so a page-locked storage stays page-locked) and copies
the saved rows into it, before ``load_state_dict`` finishes the restore.

Written rows are the leading ones as long as the ring has not wrapped
(``len(storage) < max_size``: a round-robin writer starts at row 0); a full or
wrapped storage is saved whole.
"""

from __future__ import annotations

import copy

import torch
from tensordict import TensorDict
from torchrl.data.replay_buffers.storages import TensorStorage


def leading_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """``tensor[:rows]`` over a storage holding only those rows' bytes (same memory);
    a copy when ``tensor`` is not contiguous."""
    if rows >= tensor.shape[0]:
        return tensor
    if not tensor.is_contiguous():
        return tensor[:rows].clone()
    itemsize = tensor.element_size()
    start = tensor.storage_offset() * itemsize
    nbytes = rows * (tensor[0].numel() if tensor.ndim > 1 else 1) * itemsize
    part = tensor.untyped_storage()[start:start + nbytes]
    return torch.empty(0, dtype=tensor.dtype, device=tensor.device).set_(part, 0, (rows, *tensor.shape[1:]))


def _trimmable(storage: TensorStorage, state: dict) -> int | None:
    """The rows to keep, or None when the state is saved whole."""
    saved = state.get("_storage")
    rows = state.get("_len", 0)
    if storage.ndim != 1 or not isinstance(saved, dict) or not saved or rows >= storage.max_size:
        return None
    return rows


def filled_storage_state(storage: TensorStorage) -> dict:
    """``storage.state_dict()`` with each tensor cut to the written rows (see the module docstring)."""
    state = storage.state_dict()
    rows = _trimmable(storage, state)
    if rows is None:
        return state
    saved = state["_storage"]
    trimmed = copy.copy(saved)  # keeps the ``_metadata`` attribute (batch sizes)
    for key, value in saved.items():
        if isinstance(value, torch.Tensor):
            trimmed[key] = leading_rows(value, rows)
    metadata = getattr(saved, "_metadata", None)
    if metadata is not None:
        trimmed._metadata = {key: {**meta, "batch_size": torch.Size([rows, *meta["batch_size"][1:]])}
                             if "batch_size" in meta else meta for key, meta in metadata.items()}
    return {**state, "_storage": trimmed}


def load_filled_storage_state(storage: TensorStorage, state: dict) -> dict:
    """Prepare ``storage`` for a state of :func:`filled_storage_state`: allocate its full
    size (unless a storage of that layout is allocated already) and copy the saved rows in.
    Returns the state to pass to ``storage.load_state_dict`` (unchanged where the state
    holds the whole storage)."""
    saved = state.get("_storage")
    if storage.ndim != 1 or not isinstance(saved, dict) or not saved:
        return state
    rows_td = TensorDict().load_state_dict(copy.copy(saved), strict=False)  # references, no copy
    rows = rows_td.shape[0] if rows_td.batch_dims else 0
    if rows == 0 or rows >= storage.max_size:
        return state
    if storage._storage is None:
        storage._init(rows_td[0])  # one row's layout: the storage allocates max_size of them
    storage._storage[:rows].update_(rows_td)
    return {**state, "_storage": storage._storage.state_dict()}  # loading onto itself is a no-op

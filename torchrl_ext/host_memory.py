"""Page-locked host memory of exactly the size asked for.

``Tensor.pin_memory()`` (and ``TensorDict.pin_memory()``) copies into a block of
torch's caching host allocator, which rounds every block up to the next power
of two: a 6.3 GiB replay storage pins 8 GiB, per learner process, and holds a
pageable twin until the copy is done. :func:`page_locked_like` instead maps
the bytes each tensor needs (rounded up to a page) and page-locks that mapping
with ``cudaHostRegister``: what is locked is what is used, nothing is copied,
and the mappings lie outside the malloc heap (unlocked and unmapped when their
last tensor is freed). One mapping per tensor: ``torch.save`` refuses tensors
of different dtypes viewing one storage.
"""

from __future__ import annotations

import mmap

import torch
from tensordict import TensorDictBase

_CUDA_HOST_REGISTER_PORTABLE = 1  # pinned for every CUDA context, not only the current device's


def register_host_memory(address: int, nbytes: int) -> None:
    """Page-lock ``nbytes`` at ``address`` for CUDA (``cudaHostRegister``)."""
    error = int(torch.cuda.cudart().cudaHostRegister(address, nbytes, _CUDA_HOST_REGISTER_PORTABLE))
    if error != 0:
        raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed with cudaError {error}")


def unregister_host_memory(address: int) -> None:
    """Undo :func:`register_host_memory` (``cudaHostUnregister``). Without a started CUDA
    runtime nothing was registered with it, and ``cudart()`` would start one: from a
    finalizer that the garbage collector runs inside torch.cuda's own lazy-init lock (held
    while ``torch.manual_seed`` queues its CUDA seeding), that waits on itself forever."""
    if not torch.cuda.is_initialized():
        return
    torch.cuda.cudart().cudaHostUnregister(address)


class _LockedPages(mmap.mmap):
    """Anonymous pages page-locked for CUDA. Tensors made from them with
    ``torch.frombuffer`` keep them alive; the last one freed unregisters them
    here, before ``mmap`` unmaps them."""

    def __del__(self):
        address = self.__dict__.pop("registered_at", None)
        if address is not None:
            try:
                unregister_host_memory(address)
            except Exception:  # noqa: BLE001 -- interpreter shutdown: CUDA may be gone already
                pass


def locked_nbytes(template: TensorDictBase) -> int:
    """Bytes :func:`page_locked_like` locks for ``template``: each leaf's, rounded up to a page."""
    return sum(_page_rounded(t.numel() * t.element_size()) for t in template.values(True, True))


def page_locked_like(template: TensorDictBase) -> TensorDictBase:
    """Uninitialised tensors with ``template``'s structure, shapes and dtypes, on the
    host, each in its own page-locked mapping of its size rounded up to a page.

    ``template`` may be an expanded view (``step.expand(capacity)``): only its
    shapes are read, nothing is allocated for it.
    """
    return template.apply(page_locked_empty, device=torch.device("cpu"))


def page_locked_empty(like: torch.Tensor) -> torch.Tensor:
    """An uninitialised host tensor shaped like ``like``, in its own page-locked mapping."""
    if like.numel() == 0:
        return torch.empty(like.shape, dtype=like.dtype)
    nbytes = _page_rounded(like.numel() * like.element_size())
    pages = _LockedPages(-1, nbytes)
    # No copy; the tensor's storage keeps ``pages`` alive and spans its own bytes only.
    flat = torch.frombuffer(pages, dtype=like.dtype, count=like.numel())
    register_host_memory(flat.data_ptr(), nbytes)
    pages.registered_at = flat.data_ptr()
    return flat.view(like.shape)


def _page_rounded(nbytes: int) -> int:
    return -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE

"""A fast path in tensordict's ``TensorDictBase.from_any`` for plain tensors.

Every :class:`~tensordict.nn.TensorDictModule` call writes each output through
``TensorDict.from_any(tensor)`` (tensordict 0.14, ``nn/common.py``), and
``from_any`` returns a tensor unchanged only after testing whether pandas is
installed, with ``importlib.util.find_spec("pandas")`` on every call: a search
of ``sys.path`` per module output. A model-based RL update calls a few thousand
modules, so on a CPU this is a measurable share of an eager update. A tensor
is never a DataFrame or an HDF5 file, so
returning it before those tests changes no result. The upstream fix is the same
early return at the top of ``from_any``.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase


def install_from_any_fast_path() -> None:
    """Make ``TensorDictBase.from_any(tensor)`` return ``tensor`` at once (idempotent)."""
    current = TensorDictBase.__dict__["from_any"].__func__
    if getattr(current, "_returns_tensors_first", False):
        return

    def from_any(cls, obj, **kwargs):
        if isinstance(obj, torch.Tensor):
            return obj  # what the full path returns for a tensor, minus its imports search
        return current(cls, obj, **kwargs)

    from_any._returns_tensors_first = True
    from_any.__doc__ = current.__doc__
    TensorDictBase.from_any = classmethod(from_any)

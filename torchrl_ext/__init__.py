"""Small extensions of TorchRL that upstream lacks, each written to be sent upstream.

Nothing here imports ``dreamer``.
"""

from torchrl_ext.imagination import FixedBoundsTanhNormal, NonTerminatingDreamerEnv
from torchrl_ext.replay import PinnedLazyTensorStorage, PlainWriteReplayBuffer, SliceCursorWriter

__all__ = [
    "FixedBoundsTanhNormal",
    "NonTerminatingDreamerEnv",
    "PinnedLazyTensorStorage",
    "PlainWriteReplayBuffer",
    "SliceCursorWriter",
]

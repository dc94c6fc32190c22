"""The learner's device and precision, decided once at start."""

from __future__ import annotations

import torch


def resolve_device(device: str) -> torch.device:
    """``device`` as configured: auto = CUDA when present, else CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_autocast(choice: str, device: torch.device) -> torch.dtype | None:
    """``autocast`` as configured -> the dtype to autocast to, or None (fp32).

    auto = bf16 where the device runs it natively; never emulated (slower than fp32).
    """
    if choice == "off":
        return None
    if choice == "bf16":
        return torch.bfloat16
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None

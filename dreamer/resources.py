"""Device, threads and precision chosen for this machine, decided once at start."""

from __future__ import annotations

import os

import torch

from dreamer.config import Config


def resolve_device(cfg: Config) -> torch.device:
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


def resolve_threads(cfg: Config, workers: int) -> int:
    """Learner intra-op threads: the cores the collector workers leave free."""
    if cfg.threads is not None:
        return cfg.threads
    return max(1, (os.cpu_count() or 1) - workers)


def resolve_autocast(cfg: Config, device: torch.device) -> torch.dtype | None:
    """bf16 where the device runs it natively; never emulated (that is slower than fp32)."""
    if cfg.autocast == "off":
        return None
    if cfg.autocast == "bf16":
        return torch.bfloat16
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None

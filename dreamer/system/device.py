"""The learner's device and precision, decided once at start."""

from __future__ import annotations

import torch

from dreamer.errors import UserError


def resolve_device(device: str) -> torch.device:
    """``device`` as configured: auto = CUDA when present, else CPU.

    An explicit CUDA device this process cannot use is one line saying why
    (a CPU-only torch build, no visible GPU, an index past the last GPU),
    not torch's assertion from deep inside the first allocation.
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type != "cuda":
        return resolved
    if torch.version.cuda is None:
        raise UserError(
            f"device={device} but this torch ({torch.__version__}) is a CPU-only build: install the CUDA "
            "wheel of the same torch version, or set device=cpu (device=auto picks what is there)"
        )
    if not torch.cuda.is_available():
        raise UserError(
            f"device={device} but no CUDA device is visible (CUDA_VISIBLE_DEVICES, driver): "
            "set device=cpu, or device=auto to use a GPU only when one is there"
        )
    count = torch.cuda.device_count()
    if resolved.index is not None and resolved.index >= count:
        raise UserError(f"device={device} but only {count} CUDA device(s) are visible: use cuda:0..cuda:{count - 1}")
    return resolved


def resolve_autocast(choice: str, device: torch.device) -> torch.dtype | None:
    """``autocast`` as configured -> the dtype to autocast to, or None (fp32).

    auto = bf16 only where the GPU runs it natively (Ampere and later);
    ``is_bf16_supported()`` alone also counts emulated bf16 (V100, T4), which is
    slower than fp32.
    """
    if choice == "off":
        return None
    if choice == "bf16":
        return torch.bfloat16
    if device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False):
        return torch.bfloat16
    return None


def configure_cuda_math(device: torch.device, fast: bool) -> str:
    """On CUDA: TF32 for fp32 matmuls and convolutions, and cudnn.benchmark (our
    shapes are fixed, so the fastest conv kernels are found once); ``fast=False``
    keeps full fp32 precision and cudnn's default kernel choice. Returns what was
    set, for the start line. No-op off CUDA: on CPU the matmul precision setting
    would reach oneDNN and change numbers there too.
    """
    if device.type != "cuda":
        return "off (not CUDA)"
    # The legacy global setter on purpose: inductor reads the same setting
    # (torch.get_float32_matmul_precision), and mixing it with the per-backend
    # fp32_precision API makes either reader raise.
    torch.set_float32_matmul_precision("high" if fast else "highest")
    torch.backends.cudnn.allow_tf32 = fast
    torch.backends.cudnn.benchmark = fast
    return "tf32+cudnn.benchmark" if fast else "off"


# Above this many parameters a model is GPU-sized: a CPU spends a minute or more
# on one of its updates and tens of GB of RAM on its activations (measured times
# in docs/PERFORMANCE.md). size25m (22-28M) and the CPU presets stay below;
# size50m (40-49M, states or pixels) and up warn.
GPU_SIZED_PARAMETERS = 30_000_000


def gpu_sized_on_cpu(parameters: int, device: torch.device) -> str | None:
    """A warning for a GPU-sized model about to train on the CPU; None otherwise."""
    if device.type != "cpu" or parameters <= GPU_SIZED_PARAMETERS:
        return None
    return (f"{parameters / 1e6:.0f}M parameters on the CPU: this model is sized for a GPU (on a CPU its "
            "updates are slow and its activations take much of the RAM; measured times: docs/PERFORMANCE.md). "
            "For a CPU run pick a smaller model (model=size12m) or experiment=small")

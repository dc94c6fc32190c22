"""How far two float32 computations of the same value may differ when only their summation order does.

Two sums of the same ``terms`` float32 numbers, added in different orders, differ by at most about
``terms x eps x sum(|x_i|)`` (Higham, *Accuracy and Stability of Numerical Algorithms*, 2002, §4.2).
The order is not ours to fix: it follows the kernel's blocking, which changes with the tensor's
shape and with the CPU (8-lane AVX2, 16-lane AVX-512, AMX tiles, oneDNN's choice). A test comparing
two code paths that sum differently compares with this bound, at the value's own scale; a real
mistake (a wrong step, a missing term) is orders of magnitude larger.
"""

from __future__ import annotations

import torch

FLOAT32_EPS = torch.finfo(torch.float32).eps  # 2**-23


def summation_tolerance(terms: int, scale: float) -> float:
    """The absolute difference two orders of summing ``terms`` float32 numbers whose absolute
    values add up to about ``scale`` may show."""
    return terms * FLOAT32_EPS * scale

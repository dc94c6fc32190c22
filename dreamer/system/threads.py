"""The learner's intra-op threads, decided once at start."""

from __future__ import annotations

import os


def resolve_threads(threads: int | None, workers: int) -> int:
    """Learner intra-op threads: ``threads`` as configured, or (null) the cores
    the ``workers`` collector processes leave free."""
    if threads is not None:
        return threads
    return max(1, (os.cpu_count() or 1) - workers)

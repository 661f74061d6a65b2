"""The median wall time of a call repeated, for the benchmarks that time one function."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    """(median milliseconds of ``repeat`` calls of ``fn``, what the last call returned)."""
    times, out = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), out

"""Summary statistics of timed iterations, rates in MB/s, and how many iterations a size gets."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def stats(times: Sequence[float]) -> dict[str, float]:
    ordered = sorted(times)
    p90 = ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]
    return {"median_ms": round(1e3 * statistics.median(ordered), 3), "p90_ms": round(1e3 * p90, 3),
            "mean_ms": round(1e3 * statistics.fmean(ordered), 3)}


def rate(nbytes: float, seconds: float) -> float:
    return round(nbytes / seconds / 1e6, 2) if seconds > 0 else 0.0


def iterations_for(numel: int, repeats: int) -> int:
    """Timed iterations: `repeats` from 10 M parameters up, proportionally more below (at most 10x)."""
    return max(repeats, min(10 * repeats, math.ceil(repeats * 1e7 / numel)))


def warmup_for(iterations: int, warmup: int) -> int:
    return max(warmup, iterations // 10)


def human(numel: int) -> str:
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if numel >= div:
            value = numel / div
            return f"{value:g}{suffix}" if value == int(value) else f"{value:.3g}{suffix}"
    return str(numel)

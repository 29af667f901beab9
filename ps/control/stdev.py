"""The sample standard deviation of floats as statistics.stdev gives it, bit for bit: the correctly
rounded square root of the exact sample variance. statistics.stdev sums in Fractions; a decision takes
it of every worker's times, and at thousands of workers that is most of its time. Here the floats,
dyadic rationals, are scaled to integers over one power of two, so the variance is exact in integer
arithmetic. A decision takes it of the same times several times (the balance tests, the noise of
the plan in force), so the last values' deviations are kept. Pure."""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

KEPT = 1 << 14
"""The standard deviations kept (one or two per worker at thousands of workers)."""
_SQRT_BITS = 2 * sys.float_info.mant_dig + 3
"""Twice the bits of the integer square root taken: a float's and two more, so that rounding it to
odd, then to a float, rounds the true root correctly (statistics' own width)."""


def stdev(values: Sequence[float]) -> float:
    """statistics.stdev(values) for two or more values (StatisticsError with fewer); a value that is
    not finite is left to statistics.stdev."""
    if len(values) < 2:
        raise statistics.StatisticsError("stdev requires at least two data points")
    return _stdev(tuple(values))


@lru_cache(maxsize=KEPT)
def _stdev(values: tuple[float, ...]) -> float:
    """`stdev` of two or more values."""
    try:
        ratios = [v.as_integer_ratio() for v in values]
    except (OverflowError, ValueError):
        return statistics.stdev(values)
    scale = max(d for _, d in ratios)  # every denominator is a power of two, so it divides the largest
    scaled = [n * (scale // d) for n, d in ratios]
    count = len(scaled)
    total = sum(scaled)
    # the sum of squared deviations over count - 1, scale² and count: (count·Σx² − (Σx)²) / (count·(count−1)·scale²)
    numerator = count * sum(x * x for x in scaled) - total * total
    denominator = count * (count - 1) * scale * scale
    common = math.gcd(numerator, denominator)
    return _sqrt_of_fraction(numerator // common, denominator // common)


def _sqrt_of_fraction(n: int, m: int) -> float:
    """The square root of n/m (n >= 0, m > 0, in lowest terms) as a float, correctly rounded: an
    integer square root of _SQRT_BITS bits, rounded to odd, then divided as ints (which rounds once).
    The method is that of "Emulation of FMA and correctly rounded sums: proved algorithms using
    rounding to odd"."""
    q = (n.bit_length() - m.bit_length() - _SQRT_BITS) // 2
    if q >= 0:
        return (_isqrt_to_odd(n, m << 2 * q) << q) / 1
    return _isqrt_to_odd(n << -2 * q, m) / (1 << -q)


def _isqrt_to_odd(n: int, m: int) -> int:
    """The integer square root of n/m, rounded to odd (an inexact root gets its last bit set)."""
    a = math.isqrt(n // m)
    return a | (a * a * m != n)


def rough_spreads(runs: Sequence[Sequence[float]]) -> list[tuple[list[int], np.ndarray, np.ndarray, np.ndarray]]:
    """The runs of each length (one time or more) as one float array: for each length, the runs'
    indices in `runs`, their times, their means and their sample standard deviations (0 for one
    time). Rough: a float sum of a few dozen times is off the exact one by a few ulps of the largest,
    so a caller takes `stdev` again only where a rough value is too near a bound to decide (the exact
    one of every worker's run was most of a decision at thousands of workers)."""
    by_length: dict[int, list[int]] = {}
    for i, t in enumerate(runs):
        if len(t):
            by_length.setdefault(len(t), []).append(i)
    out = []
    for length, index in by_length.items():
        times = np.array([runs[i] for i in index], dtype=np.float64)
        mean = times.mean(axis=1)
        spread = np.sqrt(((times - mean[:, None]) ** 2).sum(axis=1) / max(length - 1, 1))
        out.append((index, times, mean, spread))
    return out

"""Integer splits of a global batch: proportional shares that sum exactly to a total (largest
remainders), and water-filling within per-worker bounds (Eq. 8 without OmniLearn's equal-subtraction
bias), with the rounding to a sum both rest on."""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping

from ps.control.checks import integer, integers, positives, reals, same_keys


def reachable(keys: Iterable[str], total: int, lower: Mapping[str, int], upper: Mapping[str, int]) -> bool:
    """Whether the bounds of `keys` can make up `total`: Σ lower <= total <= Σ upper over them."""
    keys = list(keys)
    return sum(lower[k] for k in keys) <= total <= sum(upper[k] for k in keys)


def clip(value: int, lower: int, upper: int) -> int:
    """Clamp `value` to [lower, upper]."""
    return max(lower, min(upper, value))


def round_half_up(value: float) -> int:
    """Round to the nearest integer, halves up (Python's round() goes to even, which is surprising here)."""
    return math.floor(value + 0.5)


def round_to_sum(
    exact: Mapping[str, float], total: int, lower: Mapping[str, int], upper: Mapping[str, int],
    speeds: Mapping[str, float] | None = None,
) -> dict[str, int]:
    """Round `exact` (already within bounds, summing to about `total`) to integers summing to `total`.

    Floors first, then hands the missing units out one at a time, never past a bound: without
    `speeds`, to the largest fractional parts (Hamilton; ties: first key first); with `speeds` (each
    worker's samples per unit of time, any scale), to the worker whose time b/speed is the shortest
    with the unit, so that the round, the slowest worker's time, is as short as whole units allow
    (ties: the larger fractional part, then the first key). The two differ by one unit at most per
    worker, which matters when a unit is a micro-batch of many samples: Hamilton gives a slow
    worker whose share is 2.5 micro-batches a third, and lengthens the round by a fifth.
    The reverse if flooring overshot, which only float error can cause.
    Requires sum(lower) <= total <= sum(upper).
    """
    result = {k: clip(math.floor(x), lower[k], upper[k]) for k, x in exact.items()}
    left = total - sum(result.values())
    order = {k: i for i, k in enumerate(result)}  # ties go to the first key: the heaps' last resort

    def gain(k: str) -> tuple[float, ...]:  # the next unit's priority, least first
        if speeds is None:
            return (-(exact[k] - result[k]), order[k])
        return ((result[k] + 1) / speeds[k], -(exact[k] - result[k]), order[k])

    # one heap entry per worker with room, so that handing out `left` units costs O((n + left) log n)
    heap = [(gain(k), k) for k in result if result[k] < upper[k]] if left > 0 else []
    heapq.heapify(heap)
    while left > 0:
        if not heap:
            raise ValueError(f"cannot round to {total}: the upper bounds sum to less")
        _, k = heapq.heappop(heap)
        result[k] += 1
        left -= 1
        if result[k] < upper[k]:
            heapq.heappush(heap, (gain(k), k))
    heap = [((exact[k] - result[k], order[k]), k) for k in result if result[k] > lower[k]] if left < 0 else []
    heapq.heapify(heap)
    while left < 0:
        if not heap:
            raise ValueError(f"cannot round to {total}: the lower bounds sum to more")
        _, k = heapq.heappop(heap)
        result[k] -= 1
        left += 1
        if result[k] > lower[k]:
            heapq.heappush(heap, ((exact[k] - result[k], order[k]), k))
    return result


def largest_remainder(weights: Mapping[str, float], total: int) -> dict[str, int]:
    """Split `total` into non-negative integers proportional to `weights`, summing exactly to `total`.

    Hamilton's method: floor every exact share, give the units left over to the largest fractional
    parts (ties go to the first key), so each share is less than one unit from its exact value.
    """
    total = integer("total", total, minimum=0)
    w = reals("weight", weights)
    if any(v < 0 for v in w.values()):
        raise ValueError("weights must be >= 0")
    if total == 0:
        return {k: 0 for k in w}
    top = max(w.values(), default=0.0)
    if top <= 0:
        raise ValueError(f"cannot split total {total}: no positive weight")
    norm = {k: v / top for k, v in w.items()}
    mass = math.fsum(norm.values())
    exact = {k: v / mass * total for k, v in norm.items()}
    return round_to_sum(exact, total, {k: 0 for k in w}, {k: total for k in w})


def fit_to_sum(
    targets: Mapping[str, float], total: int, lower: Mapping[str, int], upper: Mapping[str, int],
    for_time: bool = False,
) -> dict[str, int]:
    """Integers proportional to `targets`, within [lower, upper] per key, summing exactly to `total`.

    Water-filling: scale the free keys so they fill what is left of `total`; if clipping to the
    bounds then overshoots, pin the keys clipped at their lower bound (they stay there at any smaller
    scale), if it undershoots pin the ones clipped at their upper bound, and redistribute over the
    rest; repeat (at most one round per key). The result is clip(s * target, lower, upper) with one
    common scale s, rounded within the bounds by largest remainders, or with `for_time` to the
    shortest round at speeds proportional to `targets` (`round_to_sum`; Eq. 8 without OmniLearn's
    equal-subtraction bias). Raises ValueError if the bounds cannot meet `total`.
    """
    exact, lo, hi = water_fill(targets, total, lower, upper)
    return round_to_sum(exact, total, lo, hi, speeds=targets if for_time else None)


def round_ms(plan: Mapping[str, int], speeds: Mapping[str, float]) -> float:
    """The round a plan takes when each worker's time is its batch over its speed: the slowest's."""
    return max((b / speeds[k] for k, b in plan.items()), default=0.0)


def water_fill(
    targets: Mapping[str, float], total: int, lower: Mapping[str, int], upper: Mapping[str, int]
) -> tuple[dict[str, float], dict[str, int], dict[str, int]]:
    """Validate the inputs of `fit_to_sum` and return its real-valued solution with the integer bounds."""
    same_keys(targets=targets, lower=lower, upper=upper)
    total = integer("total", total)
    lo = integers("lower bound", lower, targets)
    hi = integers("upper bound", upper, targets)
    for k in targets:
        if lo[k] > hi[k]:
            raise ValueError(f"lower bound {lo[k]} of {k!r} exceeds its upper bound {hi[k]}")
    t = positives("target", targets)
    if sum(lo.values()) > total:
        raise ValueError(f"infeasible: lower bounds sum to {sum(lo.values())} > total {total}")
    if sum(hi.values()) < total:
        raise ValueError(f"infeasible: upper bounds sum to {sum(hi.values())} < total {total}")
    if not t:
        return {}, lo, hi
    top = max(t.values())
    t = {k: v / top for k, v in t.items()}

    pinned: dict[str, float] = {}
    free = list(t)
    scaled: dict[str, float] = {}
    while free:
        rest = total - math.fsum(pinned.values())
        level = rest / math.fsum(t[k] for k in free)
        scaled = {k: level * t[k] for k in free}
        below = [k for k in free if scaled[k] < lo[k]]
        above = [k for k in free if scaled[k] > hi[k]]
        if not below and not above:
            break
        clipped = {k: min(hi[k], max(lo[k], x)) for k, x in scaled.items()}
        excess = math.fsum(clipped.values()) - rest
        if abs(excess) <= 1e-9 * max(1.0, abs(rest)):
            scaled = clipped
            break
        pin = below if excess > 0 else above
        for k in pin or below + above:
            pinned[k] = clipped[k]
        free = [k for k in free if k not in pinned]
        scaled = {}
    return {k: pinned[k] if k in pinned else scaled[k] for k in t}, lo, hi

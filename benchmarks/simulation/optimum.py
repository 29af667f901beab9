"""The exact best split of a global batch B over workers whose step takes t_k(b) = q_k·b + s_k: the
plan that minimises the round, max over the workers with a batch of t_k(b_k), with Σ b_k = B, every
batch within [lo, hi] or 0 (parked: a worker whose fixed cost alone outlasts the others' round).

Water-filling on a level T: at T each worker takes the most samples it finishes within T,
cap_k(T) = min(hi, ⌊(T − s_k)/q_k⌋), and a worker that cannot finish its minimum batch within T is
parked. The continuous water level (T = (B + Σ s/q) / Σ 1/q over the workers in) starts a bisection
on T for the least level whose caps add up to B: the integer optimum is that level, one of the values
t_k(b). Its caps, trimmed to B from the workers that finish last, are the plan (topped up to B by
the workers that finish first where they fall short: a fixed cost so large that a unit's time is
below its float resolution makes the caps jump past the level's). Vectorised with
numpy: one level costs O(N). Exact for a minimum batch of one unit (the default: `min_batch` 1, or
one micro-batch); with larger minimums a parked worker that would take part at the optimum level only
with fewer than its minimum is left parked."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_BISECTIONS = 200


@dataclass(frozen=True)
class Optimum:
    """The best plan (batches in samples, 0: parked) and its round (ms, the slowest finish)."""

    batches: np.ndarray
    round_ms: float

    @property
    def parked(self) -> int:
        return int(np.count_nonzero(self.batches == 0))


def round_ms(q: np.ndarray, s: np.ndarray, batches: np.ndarray) -> float:
    """A plan's round: the slowest finish among the workers with a batch (0 when none has one)."""
    busy = batches > 0
    return float(np.max(q[busy] * batches[busy] + s[busy])) if busy.any() else 0.0


def _caps(q: np.ndarray, s: np.ndarray, level: float, lo: int, hi: int, park: bool) -> np.ndarray:
    """Each worker's most units finished within `level` (0 if it cannot finish `lo`; `lo` if parking is
    not allowed)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        cap = np.floor((level - s) / q)
    cap = np.where(q * (cap + 1) + s <= level, cap + 1, cap)  # a floor that float error took one under
    cap = np.minimum(cap, hi)
    return np.where(cap >= lo, cap, 0 if park else lo).astype(np.int64)


def best_split(q: np.ndarray, s: np.ndarray, total: int, lo: int, hi: int, *, unit: int = 1,
               park: bool = True) -> Optimum:
    """The plan of least round for `total` samples in whole units of `unit` (a micro-batch), each
    worker's batch 0 (with `park`) or within [lo, hi] samples. ValueError where the bounds cannot
    make up `total`."""
    q, s = np.asarray(q, dtype=float), np.asarray(s, dtype=float)
    if total % unit:
        raise ValueError(f"total {total} is not a whole number of units of {unit}")
    units, lo_u, hi_u = total // unit, -(-lo // unit), hi // unit
    qu = q * unit
    least = -(-units // hi_u) if hi_u else len(q) + 1  # the fewest workers that hold `units` within `hi`
    busy = least if park else len(q)  # the fewest that take part, each with `lo` at the least
    if len(q) == 0 or least > len(q) or busy * lo_u > units:
        raise ValueError(f"{len(q)} workers with batches in [{lo}, {hi}] cannot make up {total}")
    # the continuous water level over everyone, a lower bound of the integer one
    low = min(float((units + np.sum(s / qu)) / np.sum(1.0 / qu)), float(np.min(qu * lo_u + s)))
    high = float(np.max(qu * hi_u + s))
    low = min(low, high)
    for _ in range(_BISECTIONS):
        mid = (low + high) / 2
        if mid in (low, high):
            break
        if _caps(qu, s, mid, lo_u, hi_u, park).sum() >= units:
            high = mid
        else:
            low = mid
    plan = _fit(qu, s, _caps(qu, s, high, lo_u, hi_u, park), units, lo_u, hi_u)
    return Optimum(plan * unit, round_ms(qu, s, plan))


def _fit(q: np.ndarray, s: np.ndarray, plan: np.ndarray, units: int, lo: int, hi: int) -> np.ndarray:
    """`plan` brought to `units`: trimmed (`_trim`) where it is over, topped up (`_fill`) where it is
    under. Parking a worker at its minimum can leave it under, and unparking one over; neither undoes
    the other, since k busy workers are parked to k - 1 only where k·lo > units and unparked back only
    where (k - 1)·hi < units: no k' workers could make up `units`, which best_split refuses first."""
    plan = plan.copy()
    while (excess := int(plan.sum()) - units) != 0:
        (_trim if excess > 0 else _fill)(q, s, plan, abs(excess), lo, hi)
    return plan


def _trim(q: np.ndarray, s: np.ndarray, plan: np.ndarray, excess: int, lo: int, hi: int) -> None:
    """Take up to `excess` units from `plan`: one each from the workers above their minimum that
    finish last, or an equal share from each where `excess` outnumbers them (the caps of a level a
    float cannot resolve overshoot by millions, one unit a pass would not end); where everyone is at
    the minimum, park the slowest."""
    room = np.flatnonzero(plan > lo)
    if len(room) == 0:  # only with minimums above a unit
        busy = np.flatnonzero(plan > 0)
        plan[busy[np.argmax(q[busy] * plan[busy] + s[busy])]] = 0
        return
    order = room[np.argsort(-(q[room] * plan[room] + s[room]), kind="stable")]
    if excess < len(order):
        plan[order[:excess]] -= 1
    else:
        plan[order] -= np.minimum(plan[order] - lo, excess // len(order))


def _fill(q: np.ndarray, s: np.ndarray, plan: np.ndarray, short: int, lo: int, hi: int) -> None:
    """Give up to `short` units to `plan`: one each to the busy workers below `hi` that finish first
    with it, or an equal share to each where `short` outnumbers them; where every busy one is at
    `hi`, unpark the worker that finishes its minimum first."""
    room = np.flatnonzero((plan > 0) & (plan < hi))
    if len(room) == 0:
        idle = np.flatnonzero(plan == 0)
        plan[idle[np.argmin(q[idle] * lo + s[idle])]] = lo
        return
    order = room[np.argsort(q[room] * (plan[room] + 1) + s[room], kind="stable")]
    if short < len(order):
        plan[order[:short]] += 1
    else:
        plan[order] += np.minimum(hi - plan[order], short // len(order))

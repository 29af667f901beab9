"""OptPerf (Cannikin §3.3, §4.2): the integer split of a global batch that minimises the predicted
round time, and whether a worker should be parked.

A BSP round takes T = max_i f_i(b_i) + c: every worker's finish time f_i at its batch (its fitted
step time plus the communication it leaves exposed, time_fit.Finish) and the round's overhead c
(what the server and the wire add after the last push: the wait, the step, the replies). For
compute-bound workers the optimum finishes them together (Cannikin Appendix A.1): in the continuous
limit b_i = (μ − s_i)/q_i with μ = (B + Σ s_i/q_i) / Σ 1/q_i. Here the split is solved on integers
directly, for any nondecreasing f_i: each unit of B goes to the worker that would finish it
soonest (exact for min-max with nondecreasing costs), after a bisection on T has placed all but a
few units at once; bounds are water levels the fill cannot cross.

A worker whose fixed cost alone exceeds the round the others reach without it can only slow the
round down at any batch b >= 1; `best_plan` compares the round with it held at its share (its
minimum batch, at worst) against the round with it parked (b = 0, its share moved to the others)
and takes the shorter; the best set to park is always the workers slowest at their minimum batch.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping

from ps.control.split import fit_to_sum

FinishTime = Callable[[int], float]
"""A worker's predicted finish time (ms) at a batch; nondecreasing."""

_BISECTIONS = 64


def split(times: Mapping[str, FinishTime], total: int, lower: Mapping[str, int],
          upper: Mapping[str, int]) -> dict[str, int]:
    """Integers within [lower, upper] summing to `total` that minimise max_i times[i](b_i).

    Requires sum(lower) <= total <= sum(upper) (ValueError otherwise). Ties go to the first key.
    """
    keys = list(times)
    if sum(lower[k] for k in keys) > total or sum(upper[k] for k in keys) < total:
        raise ValueError(f"infeasible split of {total}: bounds sum to [{sum(lower[k] for k in keys)}, "
                         f"{sum(upper[k] for k in keys)}]")
    plan = {k: lower[k] for k in keys}
    left = total - sum(plan.values())
    if left == 0 or not keys:
        return plan
    # place most units at once: the largest level T whose caps still fit in `total`
    low = min(times[k](lower[k]) for k in keys)
    high = max(times[k](upper[k]) for k in keys)
    best = dict(plan)
    for _ in range(_BISECTIONS):
        level = (low + high) / 2
        caps = {k: _cap(times[k], level, lower[k], upper[k]) for k in keys}
        if sum(caps.values()) <= total:
            best, low = caps, level
        else:
            high = level
        if high - low <= 1e-9 * max(1.0, abs(high)):
            break
    plan = best
    left = total - sum(plan.values())
    # the rest one unit at a time, each to the worker that finishes it soonest
    heap = [(times[k](plan[k] + 1), i, k) for i, k in enumerate(keys) if plan[k] < upper[k]]
    heapq.heapify(heap)
    while left > 0:
        _, i, k = heapq.heappop(heap)
        plan[k] += 1
        left -= 1
        if plan[k] < upper[k]:
            heapq.heappush(heap, (times[k](plan[k] + 1), i, k))
    return plan


def _cap(time: FinishTime, level: float, lo: int, hi: int) -> int:
    """The largest b in [lo, hi] with time(b) <= level (lo when even lo is over it)."""
    if time(hi) <= level:
        return hi
    if time(lo) > level:
        return lo
    while hi - lo > 1:  # time(lo) <= level < time(hi)
        mid = (lo + hi) // 2
        if time(mid) <= level:
            lo = mid
        else:
            hi = mid
    return lo


def round_time(times: Mapping[str, FinishTime], plan: Mapping[str, int]) -> float:
    """The slowest finish among the workers with a batch (0 when none has one)."""
    return max((times[k](b) for k, b in plan.items() if b > 0), default=0.0)


def best_plan(
    times: Mapping[str, FinishTime],
    total: int,
    lower: Mapping[str, int],
    upper: Mapping[str, int],
    *,
    may_park: Iterable[str] = (),
    overhead: float = 0.0,
    min_gain: float = 0.0,
    prefer: Iterable[str] = (),
) -> tuple[dict[str, int], list[str], dict[str, float]]:
    """The split with the shortest predicted round, parking workers of `may_park` where that pays.

    At a round time T a worker can take part only if it finishes its minimum batch within T, and every
    worker that can only adds capacity; so the best parked set is always the candidates slowest at
    their minimum batch, a prefix of them in that order. Each prefix is solved (`split` over the
    rest) and the shortest round is taken if it beats the round with everyone in by more than
    `min_gain` (a fraction). Workers of `prefer` (those parked now) count `min_gain` slower in that
    order, so a near-tie keeps the same workers parked. Returns the plan (parked workers at 0), the parked workers (slowest
    first), and the predicted rounds compared: {"held": T with every worker in, "parked": T with the
    best prefix out} (empty when nobody was a candidate).
    """
    plan = split(times, total, lower, upper)
    held = round_time(times, plan) + overhead
    favoured = set(prefer)
    order = sorted((k for k in dict.fromkeys(may_park) if k in times),
                   key=lambda k: times[k](lower[k]) * (1.0 + min_gain if k in favoured else 1.0), reverse=True)
    trial: tuple[float, list[str], dict[str, int]] | None = None
    for n in range(1, len(order) + 1):
        out = set(order[:n])
        rest = [j for j in times if j not in out]
        if not rest:
            break
        if not sum(lower[j] for j in rest) <= total <= sum(upper[j] for j in rest):
            continue
        p = split({j: times[j] for j in rest}, total, lower, upper)
        t = round_time(times, p) + overhead
        if trial is None or t < trial[0]:
            trial = (t, order[:n], p)
    if trial is None:
        return plan, [], {}
    compared = {"held": held, "parked": trial[0]}
    if not trial[0] * (1.0 + min_gain) < held:  # shorter by more than min_gain of itself, as model.py's gain
        return plan, [], compared
    return {**dict.fromkeys(times, 0), **trial[2]}, trial[1], compared


def nearest_plan(times: Mapping[str, FinishTime], plan: Mapping[str, int], current: Mapping[str, int],
                 lower: Mapping[str, int], upper: Mapping[str, int], slack: float) -> dict[str, int]:
    """Among the splits of `plan`'s total over `plan`'s workers (the same ones parked) whose round is
    within `slack` (a fraction) of `plan`'s, one nearest the plan in force: each worker's share of
    `current` (a worker not in it keeps its batch in `plan`), scaled to the total and held under the
    largest batch it finishes within that round. Where a fixed cost dominates, many splits predict
    nearly the same round, and the optimum among them moves with every wobble of the fits; this
    keeps what the workers run at unless the fits ask for more."""
    newcomers = {k: b for k, b in plan.items() if b > 0 and current.get(k, 0) <= 0}
    stay = [k for k, b in plan.items() if b > 0 and k not in newcomers]
    if not stay:
        return dict(plan)
    level = round_time(times, plan) * (1.0 + slack)
    caps = {k: max(plan[k], _cap(times[k], level, lower[k], upper[k])) for k in stay}
    target = {k: float(min(max(current[k], lower[k], 1), caps[k])) for k in stay}
    kept = fit_to_sum(target, sum(plan[k] for k in stay), {k: lower[k] for k in stay}, caps)
    return {**{k: 0 for k in plan}, **newcomers, **kept}

"""Whether a plan in force is measured far out of balance: a planned worker's mean time above the
fastest's by more than a width (a few deadbands) beyond the noise, the noise counted as the change
test counts it (change.py: the times' relative noise and its persistence, spells of load that move
several times together). The laws' solve would move such a plan unless they are wrong there; only a
move can tell: the proportional step from the measured times (`measured_step`). Pure."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

from ps.control.auto.change import noise_and_persistence
from ps.control.auto.many_workers import family_sds
from ps.control.auto.pricing import proportional
from ps.control.auto.solve import MIN_GAIN, solve
from ps.control.model.balance import measured_early
from ps.control.model.item_rows import Item
from ps.control.performance import FinishTime

NOISE_SDS = 2.0
"""The standard errors of two means' difference that count as noise (among up to
many_workers.REFERENCE_WORKERS workers; among more, as many as keep the chance of a false alarm)."""


def far_from_balance(times: Mapping[str, Sequence[float]], history: Mapping[str, Sequence[Item]],
                     plan: Mapping[str, int], lower: Mapping[str, int], upper: Mapping[str, int],
                     width: float, means: Mapping[str, float] | None = None) -> bool:
    """Whether a worker inside its bounds, or held at its upper bound, finishes later than the fastest
    worker inside its bounds by `width` of that one's mean time plus NOISE_SDS standard errors of the
    difference (`times`: each planned worker's times at its batch; `history`: its observations,
    whose noise and persistence give the errors). Workers whose bounds fix their batch, or held at
    their lower bound, are not judged; fewer than two inside their bounds is no balance to judge.
    `means`: each worker's mean of `times`, where the caller has them."""
    stats: dict[str, tuple[float, int]] = {}
    for k, ms in times.items():
        if lower[k] == upper[k] or not ms:
            continue
        stats[k] = (statistics.fmean(ms) if means is None else means[k], len(ms))

    def error(k: str) -> float:
        mean, m = stats[k]
        noise, runs = noise_and_persistence(history.get(k, ()))
        return noise * mean * math.sqrt(min(runs, m) / m)

    inside = [k for k in stats if lower[k] < plan[k] < upper[k]]
    if len(inside) < 2:
        return False
    level = min(stats[k][0] for k in inside)
    # the noise is estimated only where it decides: the fastest (the least error among equal means) and
    # the workers late by more than the width alone
    level_error = min(error(k) for k in inside if stats[k][0] == level)
    sds = family_sds(NOISE_SDS, len(stats))  # any of many workers is late by noise alone more often
    return any(plan[k] > lower[k] and mean - level > width * level
               and mean - level > width * level + sds * math.hypot(error(k), level_error)
               for k, (mean, _) in stats.items())


def measured_step(plan: Mapping[str, int], means: Mapping[str, float], total: int, lower: Mapping[str, int],
                  upper: Mapping[str, int]) -> dict[str, int]:
    """The proportional step from the plan's measured times (OmniLearn's): each planned worker's time
    as its mean time at its batch (`means`), scaled with the batch, within the bounds; the parked stay
    parked. With a fixed cost the slowest worker's time falls less than its batch, so the step falls
    short of balance rather than past it, and the next decision goes on from times at the new batches."""
    lines: dict[str, FinishTime] = {k: proportional(mean / plan[k]) for k, mean in means.items()}
    parked = [k for k, b in plan.items() if b == 0]
    lower = {**lower, **dict.fromkeys(parked, 0)}
    upper = {**upper, **dict.fromkeys(parked, 0)}
    for k in parked:
        lines[k] = proportional(1.0)
    new, _, _ = solve(lines, {}, total, lower, upper, may_park=[], overhead=0.0, prefer=[])
    return new


def idling(in_force: Mapping[str, Sequence[float]] | None, means: Mapping[str, float] | None,
           deadband: float) -> list[str]:
    """The workers measured finishing the deadband early (model/balance.py), where their idle time adds
    up to MIN_GAIN of the workers' time: a worker among hundreds that idles costs the round nothing a
    move should be made for (`in_force`: each planned worker's times at its batch, `means` their means)."""
    if in_force is None or means is None:
        return []
    early = measured_early(in_force, deadband, means)
    level = max(means.values(), default=0.0)
    idle = math.fsum(level - means[k] for k in early) / (level * len(means)) if early else 0.0
    return early if idle >= MIN_GAIN else []

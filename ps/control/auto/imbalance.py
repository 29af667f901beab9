"""Whether a plan in force is measured far out of balance: a planned worker's mean time above the
fastest's by more than a width (a few deadbands) beyond the noise, the noise counted as the change
test counts it (change.py: the times' relative noise and its persistence, spells of load that move
several times together). The laws' solve would move such a plan unless they are wrong there; only a
move can tell. Pure."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

from ps.control.auto.change import noise_and_persistence
from ps.control.model.item_rows import Item

NOISE_SDS = 2.0
"""The standard errors of two means' difference that count as noise."""


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
    return any(plan[k] > lower[k] and mean - level > width * level
               and mean - level > width * level + NOISE_SDS * math.hypot(error(k), level_error)
               for k, (mean, _) in stats.items())

"""The model policy's probes: one batch size cannot separate a worker's time per sample from its
fixed cost, so a worker seen at one batch is moved to a second (Cannikin's Eq. 8: shares inversely
proportional to the measured time per sample), by at least PROBE_STEP. Pure."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from ps.control.model.time_fit import Finish
from ps.control.split import clip, fit_to_sum

PROBE_STEP = 0.3
"""A probe moves a worker's batch by at least this fraction (and 2 samples)."""


def probe_plan(unknown: Sequence[str], current: Mapping[str, int], fits: Mapping[str, Finish], total: int,
               lower: Mapping[str, int], upper: Mapping[str, int], exact_sum: bool, for_time: bool) -> dict[str, int]:
    """A plan that moves each worker of `unknown` to a second batch size, its share of `total` (B) by
    the measured speeds `fits` moved at least PROBE_STEP; without `exact_sum`, the planned workers'
    batches summed stand for B, rounded and clipped. `current` as it is where the bounds cannot take it.
    `for_time`: rounded for the shortest round (split.fit_to_sum)."""
    active = [k for k, b in current.items() if b > 0]
    speed = {k: current[k] / fits[k].at(current[k]) if k in fits and fits[k].at(current[k]) > 0 else 1.0
             for k in active}
    total = total if exact_sum else sum(current[k] for k in active)
    mass = math.fsum(speed.values())
    target = {k: speed[k] / mass * total for k in active}
    mean = total / len(active)
    for k in unknown:
        b, step = current[k], max(2.0, PROBE_STEP * current[k])
        if abs(target[k] - b) < step:
            down = target[k] < b or (target[k] == b and b > mean)
            target[k] = b - step if down and b - step >= lower[k] else b + step
        target[k] = min(max(target[k], lower[k]), upper[k])
    target = {k: max(v, 1e-6) for k, v in target.items()}
    if not exact_sum:
        return {**current, **{k: clip(round(target[k]), lower[k], upper[k]) for k in active}}
    inside = {k: current[k] for k in current if k not in active}
    lo = {k: lower[k] for k in active}
    hi = {k: upper[k] for k in active}
    if not sum(lo.values()) <= total <= sum(hi.values()):
        return dict(current)
    return {**inside, **fit_to_sum(target, total, lo, hi, for_time)}

"""Probes of changed workers held at their minimum batch: after a change of speed a worker's law is
the proportional line through its new times, and at the smallest batch that line overprices a worker
whose time is mostly fixed cost (one back from parking that got faster). Where such a worker finishes
earlier than the slowest by more than the deadband, yet the decision would not move it SPREAD up, it
is moved SPREAD up whatever the gain, so that its next times give it a law (law.py). A worker the
decision parks is not probed: its times at its minimum already finish after the round it solved for,
and a probe would bring it back while it is counted as parked. Pure."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from ps.control.auto.law import SPREAD
from ps.control.split import fit_to_sum


def probe_targets(candidates: Iterable[str], plan: Mapping[str, int], current: Mapping[str, int],
                  means: Mapping[str, float], lower: Mapping[str, int], upper: Mapping[str, int],
                  deadband: float) -> dict[str, int]:
    """Each of `candidates` (changed, on a proportional line) at its minimum batch in `current`, whose
    mean time (`means`) is earlier than the slowest's by more than `deadband`, and that `plan` keeps
    planned (not parked) below SPREAD up: the batch SPREAD up (within its bound)."""
    slowest = max(means.values(), default=0.0)
    out = {}
    for k in candidates:
        b = current.get(k, 0)
        up = b + max(2, math.ceil(SPREAD * b))
        early = k in means and means[k] < (1.0 - deadband) * slowest
        if b == lower[k] and early and 0 < plan[k] < up <= upper[k]:
            out[k] = up
    return out


def probe_plan(plan: Mapping[str, int], probes: Mapping[str, int], total: int, lower: Mapping[str, int],
               upper: Mapping[str, int], exact_sum: bool, for_time: bool) -> dict[str, int] | None:
    """`plan` with the `probes` at their batches and its other planned workers scaled to what they leave
    of `total` (the same ones parked; without `exact_sum`, as they are); None where their bounds cannot
    take it. `for_time`: rounded for the shortest round (split.fit_to_sum)."""
    if not exact_sum:
        return {**plan, **probes}
    rest = [k for k, b in plan.items() if b > 0 and k not in probes]
    left = total - sum(probes.values())
    if not rest or not sum(lower[k] for k in rest) <= left <= sum(upper[k] for k in rest):
        return None
    scaled = fit_to_sum({k: float(plan[k]) for k in rest}, left, {k: lower[k] for k in rest},
                        {k: upper[k] for k in rest}, for_time)
    return {**dict.fromkeys(plan, 0), **scaled, **probes}

"""Whether a plan in force is measured balanced: the model policy holds such a plan, since the equal
finish its solver aims for is there already and a re-solve would move samples by the noise in its
fits; and which workers it measures finishing early, idle for part of every round (pure)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

import numpy as np

from ps.control.stdev import rough_spreads, stdev

CLOSE = 1e-9
"""A gap that a rough standard error puts nearer than this (of the values compared) to its bound is
judged again on the exact error."""


def measured_balanced(times: Mapping[str, Sequence[float]], plan: Mapping[str, int], lower: Mapping[str, int],
                      upper: Mapping[str, int], deadband: float, means: Mapping[str, float] | None = None) -> bool:
    """Each planned worker's finish times at its batch (`times`, ms) give a mean; the fastest mean of
    the workers inside their bounds is the level. A worker inside its bounds, or held at its upper
    bound, must not finish later than the level by more than the deadband; one held at its lower
    bound must not finish earlier by more than that (it could take samples then; later is what
    holding it there chose). Differences within twice the two means' standard error count as none:
    on this many rounds they are noise. Workers whose bounds fix their batch are not judged; fewer
    than two workers inside their bounds is no balance to judge (False). `means`: each worker's mean
    of `times`, where the caller has them."""
    means = ({k: statistics.fmean(ms) for k, ms in times.items() if lower[k] != upper[k]} if means is None
             else {k: means[k] for k in times if lower[k] != upper[k]})

    def error(k: str) -> float:
        return _mean_error(times[k])

    inside = [k for k in means if lower[k] < plan[k] < upper[k]]
    if len(inside) < 2:
        return False
    level = min(means[k] for k in inside)
    band = deadband * level
    # the errors are taken only where they decide: the fastest (the least error among equal means) and
    # the workers off the level by more than the deadband alone
    off = [k for k, mean in means.items()
           if (plan[k] > lower[k] and mean - level > band) or (plan[k] <= lower[k] and level - mean > band)]
    if not off:
        return True
    level_error = min(error(k) for k in inside if means[k] == level)
    for k in off:
        mean = means[k]
        tolerance = max(band, 2.0 * math.hypot(error(k), level_error))
        late = plan[k] > lower[k] and mean - level > tolerance
        early = plan[k] <= lower[k] and level - mean > tolerance
        if late or early:
            return False
    return True


def measured_early(times: Mapping[str, Sequence[float]], deadband: float,
                   means: Mapping[str, float] | None = None) -> list[str]:
    """The workers whose mean finish time (`times` at their batches; `means`, where the caller has them)
    is earlier than the slowest worker's mean by more than the deadband of it, and by more than twice
    the standard error of their difference: measured idle for more than the deadband of every round."""
    means = {k: statistics.fmean(ms) for k, ms in times.items() if ms} if means is None else means
    if len(means) < 2:
        return []

    level = max(means.values())
    top = min(_mean_error(times[k]) for k, mean in means.items() if mean == level)
    early = [k for k, mean in means.items() if level - mean > deadband * level]
    out = []
    # each error roughly first, at once; exactly (as it was taken one at a time) only where that decides
    for k, error, largest in zip(early, *_rough_errors([times[k] for k in early]), strict=True):
        gap = level - means[k]
        bound = 2.0 * math.hypot(error, top)
        if abs(gap - bound) <= CLOSE * (gap + bound + largest):
            bound = 2.0 * math.hypot(_mean_error(times[k]), top)
        if gap > bound:
            out.append(k)
    return out


def _rough_errors(runs: Sequence[Sequence[float]]) -> tuple[list[float], list[float]]:
    """Each run's rough standard error of the mean (stdev.rough_spreads'; 0 for fewer than two times)
    and its largest time: the exact error (`_mean_error`, in integers) of thousands of workers was
    most of a decision at 10,000."""
    errors, largest = [0.0] * len(runs), [0.0] * len(runs)
    for index, times, _, spread in rough_spreads(runs):
        length = times.shape[1]
        rough = (spread / math.sqrt(length) if length > 1 else np.zeros(len(index))).tolist()
        for i, error, big in zip(index, rough, np.abs(times).max(axis=1).tolist(), strict=True):
            errors[i], largest[i] = error, big
    return errors, largest


def _mean_error(ms: Sequence[float]) -> float:
    """The standard error of the mean of `ms` (0 for one time)."""
    return stdev(ms) / math.sqrt(len(ms)) if len(ms) > 1 else 0.0

"""Whether a plan in force is measured balanced: the model policy holds such a plan, since the equal
finish its solver aims for is there already and a re-solve would move samples by the noise in its
fits (pure)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

from ps.control.stdev import stdev


def measured_balanced(times: Mapping[str, Sequence[float]], plan: Mapping[str, int], lower: Mapping[str, int],
                      upper: Mapping[str, int], deadband: float) -> bool:
    """Each planned worker's finish times at its batch (`times`, ms) give a mean; the fastest mean of
    the workers inside their bounds is the level. A worker inside its bounds, or held at its upper
    bound, must not finish later than the level by more than the deadband; one held at its lower
    bound must not finish earlier by more than that (it could take samples then; later is what
    holding it there chose). Differences within twice the two means' standard error count as none:
    on this many rounds they are noise. Workers whose bounds fix their batch are not judged; fewer
    than two workers inside their bounds is no balance to judge (False)."""
    measured: dict[str, tuple[float, float]] = {}
    for k, ms in times.items():
        if lower[k] == upper[k]:
            continue
        error = stdev(ms) / math.sqrt(len(ms)) if len(ms) > 1 else 0.0
        measured[k] = (statistics.fmean(ms), error)
    inside = [measured[k] for k in measured if lower[k] < plan[k] < upper[k]]
    if len(inside) < 2:
        return False
    level, level_error = min(inside)
    for k, (mean, error) in measured.items():
        tolerance = max(deadband * level, 2.0 * math.hypot(error, level_error))
        late = plan[k] > lower[k] and mean - level > tolerance
        early = plan[k] <= lower[k] and level - mean > tolerance
        if late or early:
            return False
    return True

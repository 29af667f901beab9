"""How far a re-solve of the model policy may move each worker: at most TRUST times its batch up (or
to an equal share of B) or down, and parking only from its minimum batch, since a fit is surest near
the batches it was measured at. The first solve and a re-probed worker are free of it. Pure."""

from __future__ import annotations

import math
from collections.abc import Mapping

TRUST = 2
"""A re-solve moves a worker's batch at most this factor up (or to an equal share) or down."""


def trusted_bounds(now: Mapping[str, int], total: int, lower: Mapping[str, int],
                   upper: Mapping[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """The bounds of each worker within TRUST of its batch in `now` (0: free: parked, or back for a
    re-probe), within `lower` and `upper`; those as they are where the trusted ones cannot meet
    `total` (parked workers at their minimum)."""
    lo = {k: max(low, math.ceil(now[k] / TRUST)) if now[k] else low for k, low in lower.items()}
    equal = math.ceil(total / len(lower))  # a small worker may always grow to an equal share
    hi = {k: min(high, max(TRUST * now[k], equal)) if now[k] else high for k, high in upper.items()}
    if sum(lo.values()) <= total <= sum(hi.values()):
        return lo, hi
    return dict(lower), dict(upper)

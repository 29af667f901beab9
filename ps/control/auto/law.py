"""A worker's law of time in batch, from its observations (model/time_fit.py): the fitted line
t(b) = q·b + s once two batch sizes at least SPREAD apart are measured (the fixed cost s is then
known), else the proportional line through its times at the newest measured batch size (OmniLearn's
law, t ∝ b: two nearby batch sizes cannot tell a fixed cost from noise). Only batch sizes measured
`min_samples` times enter it: the fit weighs a batch size by the inverse of its times' variance, and
two times that happen to agree would tilt the line. Pure."""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

from ps.control.model.observations import MAX_BATCHES, PER_BATCH, Observations
from ps.control.model.time_fit import Fit, fit_of

Item = tuple[int, int, float, float | None]
"""One observation: (sequence number, batch, ms, exposed ms or None)."""

SPREAD = 0.2
"""Two batch sizes identify a worker's fixed cost when the larger is this much above the smaller."""
ADMIT_SPREAD = 2.0
"""An admitted batch size, measured fewer than `min_samples` times, enters the fit only this many times
away from every batch size measured: nearer, its one time's noise would tilt the line."""
ADMIT_SPREAD_TWICE = 1.5
"""... or this many times away where it is measured twice or more: the mean of two times is off by
about 1/sqrt(2) of one time's noise."""


class Law(NamedTuple):
    """The fit, whether it is the worker's whole law (`known`: its fixed cost measured) or its
    proportional line, and the batch size that line goes through (None for a known law)."""

    fit: Fit
    known: bool
    batch: int | None = None


def law_of(items: Sequence[Item], min_samples: int, admitted: int | None = None) -> Law | None:
    """The law of a worker's observations (`items`, oldest first); None without any. `admitted`: a
    batch size that enters with fewer than `min_samples` times, ADMIT_SPREAD away from the others (a
    change trusted on its first times, change.QUICK: a worker stepped away from them at once is
    measured there no more)."""
    if not items:
        return None
    counts: dict[int, int] = Counter([it[1] for it in items])
    seqs = [it[0] for it in items]
    measured = [b for b, n in counts.items() if n >= min_samples]
    spread = ADMIT_SPREAD if admitted is None or counts.get(admitted, 0) < 2 else ADMIT_SPREAD_TWICE
    if admitted in counts and admitted not in measured and all(max(b / admitted, admitted / b) >= spread
                                                               for b in measured):
        measured.append(admitted)
    # a part of observations held as Observations holds them (in order, within its limits) is held so too
    held = (len(counts) <= MAX_BATCHES and max(counts.values()) <= PER_BATCH
            and all(map(operator.lt, seqs, seqs[1:])))
    if identifies_fixed_cost(measured):
        kept = set(measured)
        fit = _fit(list(items) if len(kept) == len(counts) else [it for it in items if it[1] in kept], min_samples, held)
        return None if fit is None else Law(fit, True)
    newest = next((b for _, b, _, _ in reversed(items) if b in measured), items[-1][1])
    fit = _fit([it for it in items if it[1] == newest], min_samples, held)
    return None if fit is None else Law(fit, False, newest)


def identifies_fixed_cost(batches: Sequence[int]) -> bool:
    """Whether times measured at these batch sizes identify a fixed cost: the largest is SPREAD above the
    smallest."""
    return bool(batches) and max(batches) >= (1.0 + SPREAD) * min(batches)


def _fit(items: list[Item], min_samples: int, held: bool) -> Fit | None:
    """The fit of `items` as Observations of them fit it (`held`: they are as it would hold them)."""
    return fit_of(items, min_samples) if held else Observations(items).fit(min_samples)

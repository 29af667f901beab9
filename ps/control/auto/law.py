"""A worker's law of time in batch, from its observations (model/time_fit.py): the fitted line
t(b) = q·b + s once two batch sizes at least SPREAD apart are measured (the fixed cost s is then
known), else the proportional line through its times at the newest measured batch size (OmniLearn's
law, t ∝ b: two nearby batch sizes cannot tell a fixed cost from noise). Only batch sizes measured
`min_samples` times enter it: the fit weighs a batch size by the inverse of its times' variance, and
two times that happen to agree would tilt the line. Pure."""

from __future__ import annotations

import operator
from itertools import repeat
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from ps.control.model.observations import MAX_BATCHES, PER_BATCH, Observations
from ps.control.model.time_fit import Fit, fit_of
from ps.control.model.item_rows import Item, joined
from ps.control.model.time_fits import fits_of_rows, new_tuple

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


class _Pick(NamedTuple):
    """What a worker's law is fitted from: the items, whether they make its whole law, the batch size
    of a proportional line, and whether they are as Observations holds them (in order, within its limits)."""

    items: list[Item]
    known: bool
    batch: int | None
    held: bool


def law_of(items: Sequence[Item], min_samples: int, admitted: int | None = None) -> Law | None:
    """The law of a worker's observations (`items`, oldest first); None without any. `admitted`: a
    batch size that enters with fewer than `min_samples` times, ADMIT_SPREAD away from the others (a
    change trusted on its first times, change.QUICK: a worker stepped away from them at once is
    measured there no more)."""
    pick = _pick(items, min_samples, admitted)
    if pick is None:
        return None
    fit = fit_of(pick.items, min_samples) if pick.held else Observations(pick.items).fit(min_samples)
    return None if fit is None else Law(fit, pick.known, pick.batch)


def prefix_law(obs: Observations, count: int, min_samples: int) -> Law | None:
    """`law_of(obs.items[:count], min_samples)`, as a worker's settled law is fitted after every other
    push: the first observations of those Observations holds are held as it holds them, and their
    counts are its counts less the rest's, so neither is taken again of the items."""
    items = obs.items[:count]
    if not items:
        return None
    counts = dict(obs.counts)
    for _, b, _, _ in obs.items[count:]:
        if counts[b] > 1:
            counts[b] -= 1
        else:
            del counts[b]
    kept, known, batch = choice(items, counts, min_samples, None)
    fit = fit_of(items if kept is None else [it for it in items if it[1] in kept], min_samples)
    return None if fit is None else Law(fit, known, batch)


Choice = tuple[set[int] | None, bool, int | None]
"""What a law is fitted from (`choice`): the batch sizes (None: all), whether they make the whole law,
the batch size of a proportional line."""


def laws_of(requests: Sequence[tuple[Observations, int | None]], min_samples: int,
            choices: Sequence[Choice | None] | None = None) -> list[Law | None]:
    """`law_of(obs.items, min_samples, admitted)` of each (obs, admitted), fitted at once from the
    observations' rows (model/time_fits.py, model/item_rows.py): a decision refits every worker that
    pushed since the last. `choices`: each one's `choice(obs.items, obs.counts, min_samples, admitted)`
    (None without items) where the caller keeps them."""
    if choices is None:
        choices = [choice(obs.items, obs.counts, min_samples, admitted) if obs.items else None
                   for obs, admitted in requests]
    held = [(obs, picked) for (obs, _), picked in zip(requests, choices, strict=True) if picked is not None]
    rows = joined([obs.rows for obs, _ in held])
    sizes = [len(obs.items) for obs, _ in held]
    # each worker's items at its chosen batch sizes (an Observations' items are held as it holds them);
    # a choice of every batch size it holds keeps all its rows
    chosen = [(w, b) for w, (obs, (kept, _, _)) in enumerate(held)
              if kept is not None and len(kept) < len(obs.counts) for b in kept]
    if chosen:
        worker = np.repeat(np.arange(len(held)), sizes)
        top = int(rows[:, 1].max()) + 1
        part = np.zeros(len(held), dtype=bool)
        part[[w for w, _ in chosen]] = True
        inside = part[worker]
        keep = ~inside
        keep[inside] = np.isin(worker[inside] * top + rows[inside, 1].astype(np.int64), [w * top + b for w, b in chosen])
        rows, counts = rows[keep], np.bincount(worker[keep], minlength=len(held))
    else:
        counts = np.array(sizes, dtype=np.int64)
    fits = fits_of_rows(counts, rows, min_samples)
    if len(held) == len(choices) and None not in fits:  # the laws built as time_fits builds the fits
        return list(map(new_tuple, repeat(Law), zip(fits, [c[1] for _, c in held], [c[2] for _, c in held])))
    fitted = iter(fits)
    laws: list[Law | None] = []
    for picked in choices:
        fit = None if picked is None else next(fitted)
        laws.append(None if picked is None or fit is None else Law(fit, picked[1], picked[2]))
    return laws


def _pick(items: Sequence[Item], min_samples: int, admitted: int | None) -> _Pick | None:
    """What `law_of` fits (`choice`'s items); None without items."""
    if not items:
        return None
    counts: Mapping[int, int] = Counter([it[1] for it in items])
    kept, known, batch = choice(items, counts, min_samples, admitted)
    held = _held(items, counts)
    if kept is None:
        return _Pick(list(items), known, batch, held)
    return _Pick([it for it in items if it[1] in kept], known, batch, held)


def choice(items: Sequence[Item], counts: Mapping[int, int], min_samples: int,
            admitted: int | None) -> Choice:
    """The batch sizes of `items` (not empty; `counts`: how many at each) that `law_of` fits (None: all
    of them), whether they make the whole law, and the batch size of a proportional line: the batch
    sizes measured `min_samples` times (and `admitted`) where they identify the fixed cost, else the
    newest measured one alone."""
    measured = [b for b, n in counts.items() if n >= min_samples]
    spread = ADMIT_SPREAD if admitted is None or counts.get(admitted, 0) < 2 else ADMIT_SPREAD_TWICE
    if (admitted is not None and admitted in counts and admitted not in measured
            and all(max(b / admitted, admitted / b) >= spread for b in measured)):
        measured.append(admitted)
    if measured and max(measured) >= (1.0 + SPREAD) * min(measured):  # identifies_fixed_cost written out
        kept = set(measured)
        return None if len(kept) == len(counts) else kept, True, None
    newest = items[-1][1]  # mostly measured itself: a decision asks every worker's choice
    if newest not in measured:
        newest = next((b for _, b, _, _ in reversed(items) if b in measured), newest)
    return {newest}, False, newest


def _held(items: Sequence[Item], counts: Mapping[int, int]) -> bool:
    """Whether `items` are as Observations holds them: in order, within its limits (a part of
    observations held so is held so too)."""
    seqs = [it[0] for it in items]
    return (len(counts) <= MAX_BATCHES and max(counts.values()) <= PER_BATCH
            and all(map(operator.lt, seqs, seqs[1:])))


def identifies_fixed_cost(batches: Sequence[int]) -> bool:
    """Whether times measured at these batch sizes identify a fixed cost: the largest is SPREAD above the
    smallest."""
    return bool(batches) and max(batches) >= (1.0 + SPREAD) * min(batches)

"""Many workers' fits at once (`fits_of`): time_fit.fit_of's fit of each worker's observations, the
same recency weights, outlier test, groups and weighted lines, computed over every worker's times
as arrays. A decision refits every worker that pushed since the last one, and one fit at a time
costs tens of microseconds of Python a worker: most of a decision at a thousand workers. The values
agree with fit_of's to the rounding of a float sum (fit_of sums exactly, math.fsum). Pure."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import chain, repeat
from operator import itemgetter
from typing import NamedTuple

import numpy as np

from ps.control.model.item_rows import COLUMNS, Item
from ps.control.model.time_fit import (
    MIN_REL_NOISE, OLDEST_WEIGHT, ONE_SAMPLE_REL_NOISE, OUTLIER_MADS, RECENCY, Finish, Fit, Line,
)

new_tuple = tuple.__new__
"""A tuple subclass's instance from a tuple of its fields: `map(new_tuple, repeat(Line), rows)` builds
what `Line(*row)` of each row builds, without the NamedTuple's own __new__, a Python call each."""
_WEIGHTS = np.array([*RECENCY, OLDEST_WEIGHT], dtype=np.float64)
"""The recency weight by age, the last entry for every age beyond the table's."""


class _Groups(NamedTuple):
    """Each (worker, batch size) group's recency-weighted mean, weight and count, in order of worker
    and batch size (time_fit.Group's fields as arrays)."""

    worker: np.ndarray
    batch: np.ndarray
    mean: np.ndarray
    weight: np.ndarray
    samples: np.ndarray


def fits_of(item_lists: Sequence[Sequence[Item]], min_samples: int) -> list[Fit | None]:
    """`[time_fit.fit_of(items, min_samples) for items in item_lists]`, at once."""
    counts = np.fromiter((len(items) for items in item_lists), dtype=np.int64, count=len(item_lists))
    total = int(counts.sum())
    if total == 0:
        return [None] * len(item_lists)
    flat = list(chain.from_iterable(item_lists))
    rows = np.empty((total, COLUMNS), dtype=np.float64)
    rows[:, 0] = np.fromiter(map(itemgetter(0), flat), dtype=np.int64, count=total)
    rows[:, 1] = np.fromiter(map(itemgetter(1), flat), dtype=np.int64, count=total)
    rows[:, 2] = np.fromiter(map(itemgetter(2), flat), dtype=np.float64, count=total)
    exposures = list(map(itemgetter(3), flat))
    none = exposures.count(None)
    rows[:, 3] = np.nan if none == total else (exposures if none == 0 else
                                               [np.nan if e is None else e for e in exposures])
    return fits_of_rows(counts, rows, min_samples)


def fits_of_rows(counts: np.ndarray, rows: np.ndarray, min_samples: int) -> list[Fit | None]:
    """`fits_of` of the workers' items as rows (item_rows.py), each worker's `counts[w]` of them in
    turn, oldest first."""
    out: list[Fit | None] = [None] * len(counts)
    total = len(rows)
    if total == 0:
        return out
    worker = np.repeat(np.arange(len(counts)), counts)
    seq = rows[:, 0].astype(np.int64)
    batch = rows[:, 1].astype(np.int64)
    ms = np.ascontiguousarray(rows[:, 2])
    has = ~np.isnan(rows[:, 3])
    exposed = np.ascontiguousarray(rows[:, 3]) if has.any() else None
    # every observation weighed by its age behind its worker's newest
    ends = np.cumsum(counts)
    last = np.zeros(len(counts), dtype=np.int64)
    filled = counts > 0
    last[filled] = seq[ends[filled] - 1]
    age = np.minimum(last[worker] - seq, len(RECENCY))
    weight = _WEIGHTS[age]
    groups = _groups(worker, batch, weight, ms)
    lines = _lines(groups, len(counts))
    exposure = None
    if exposed is not None:
        exposure = _exposure(_groups(worker[has], batch[has], weight[has], exposed[has]), lines[0], len(counts))
    measured = np.bincount(groups.worker, weights=groups.samples >= min_samples, minlength=len(counts))
    fitted = np.flatnonzero(filled)
    # the tuples built by tuple.__new__ over columns, no Python call a worker: the same values and
    # types as Line(...), Finish(...) and Fit(...), at thousands of workers a decision's tenth
    made: Iterable[Line] = map(new_tuple, repeat(Line), zip(*(a[fitted].tolist() for a in lines)))
    if exposure is None:
        finishes: Iterable[Finish] = map(new_tuple, repeat(Finish), zip(made, repeat(None), repeat(0.0)))
    else:
        exposures = [exposure[w] for w in fitted.tolist()]
        finishes = (Finish(line) if e is None else Finish(line, *e) for line, e in zip(made, exposures))
    fits: Iterable[Fit] = map(new_tuple, repeat(Fit), zip(finishes, measured[fitted].astype(np.int64).tolist()))
    if len(fitted) == len(out):
        return list(fits)
    for w, fit in zip(fitted.tolist(), fits):
        out[w] = fit
    return out


def _groups(worker: np.ndarray, batch: np.ndarray, weight: np.ndarray, times: np.ndarray) -> _Groups:
    """time_fit._group of every (worker, batch size): outliers left out of a group of four or more
    (further from its median than OUTLIER_MADS robust deviations, at least MIN_REL_NOISE of it), then
    the recency-weighted mean and its inverse variance."""
    key = worker * (int(batch.max()) + 1) + batch
    order = np.argsort(key, kind="stable")
    k, wt, t = key[order], weight[order], times[order]
    new = np.ones(len(t), dtype=bool)
    new[1:] = k[1:] != k[:-1]
    starts = np.flatnonzero(new)
    gid = np.cumsum(new) - 1
    size = np.diff(np.append(starts, len(t)))
    place = (gid, np.arange(len(t)) - starts[gid])  # each time's row (its group) and column in a table
    median = _medians(t, place, size)
    deviation = np.abs(t - median[gid])
    spread = _medians(deviation, place, size)
    least = np.maximum(MIN_REL_NOISE * np.abs(median), 1e-9)
    limit = OUTLIER_MADS * np.maximum(1.4826 * spread, least)
    kept = (size[gid] < 4) | (deviation <= limit[gid])
    groups = len(starts)
    n = np.bincount(gid, weights=kept, minlength=groups)
    mass = np.bincount(gid, weights=np.where(kept, wt, 0.0), minlength=groups)
    mean = np.bincount(gid, weights=np.where(kept, wt * t, 0.0), minlength=groups) / mass
    square = np.bincount(gid, weights=np.where(kept, wt * (t - mean[gid]) ** 2, 0.0), minlength=groups)
    with np.errstate(divide="ignore", invalid="ignore"):
        var = np.where(n > 1, square / mass * n / (n - 1), (ONE_SAMPLE_REL_NOISE * mean) ** 2)
    var = np.maximum(np.maximum(var, (MIN_REL_NOISE * mean) ** 2), 1e-12)
    first = order[starts]
    return _Groups(worker[first], batch[first], mean, mass / var, size)


def _medians(values: np.ndarray, place: tuple[np.ndarray, np.ndarray], size: np.ndarray) -> np.ndarray:
    """time_fit.sorted_median of each group's `values` (`place`: each value's group and place in it):
    the groups as the rows of a table, each sorted (a group holds a few dozen times at most)."""
    table = np.full((len(size), int(size.max())), np.inf)
    table[place] = values
    table.sort(axis=1)
    rows = np.arange(len(size))
    mid = size // 2
    upper = table[rows, mid]
    median: np.ndarray = np.where(size % 2 == 1, upper, (table[rows, np.maximum(mid - 1, 0)] + upper) / 2)
    return median


def _lines(groups: _Groups, workers: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """time_fit.weighted_line of each worker's groups: (q, s, var_s, cov, var_q) by worker."""
    gw, b, mean, weight = groups.worker, groups.batch.astype(np.float64), groups.mean, groups.weight
    count = np.bincount(gw, minlength=workers)
    w, sb, st, sbb, sbt = _moments(gw, b, mean, weight, workers)
    with np.errstate(divide="ignore", invalid="ignore"):
        det = w * sbb - sb * sb
        solved = det > 0
        var_s = np.where(solved, sbb / det, 1.0 / w)
        cov = np.where(solved, -sb / det, 0.0)
        var_q = np.where(solved, w / det, 0.0)
        q = np.where(solved, (w * sbt - sb * st) / det, 0.0)
        q = np.where(q <= 0, 1e-6 * st / sb, q)
        s = (st - q * sb) / w
        through_origin = s < 0
        q = np.where(through_origin, sbt / sbb, q)
        s = np.where(through_origin, 0.0, s)
        var_s = np.where(through_origin, 0.0, var_s)
        cov = np.where(through_origin, 0.0, cov)
        var_q = np.where(through_origin, 1.0 / sbb, var_q)
        # one group: the proportional line through it
        first = np.searchsorted(gw, np.arange(workers))
        one = count == 1
        at = np.minimum(first, len(gw) - 1)
        q = np.where(one, mean[at] / b[at], q)
        s = np.where(one, 0.0, s)
        var_s = np.where(one, 0.0, var_s)
        cov = np.where(one, 0.0, cov)
        var_q = np.where(one, 1.0 / (weight[at] * b[at] * b[at]), var_q)
    return q, s, var_s, cov, var_q


def _moments(gw: np.ndarray, b: np.ndarray, mean: np.ndarray, weight: np.ndarray,
             workers: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """time_fit._moments by worker: the weighted sums of 1, b, t, b² and b·t over its groups."""
    def total(values: np.ndarray) -> np.ndarray:
        return np.bincount(gw, weights=values, minlength=workers)
    return (total(weight), total(weight * b), total(weight * mean), total(weight * b * b), total(weight * b * mean))


def _exposure(groups: _Groups, q: np.ndarray, workers: int) -> list[tuple[Line, float] | None]:
    """time_fit.exposed_line of each worker's exposed groups (None: it has none), its slope within
    [-q, 0] for the worker's fitted q."""
    gw, b, mean, weight = groups.worker, groups.batch.astype(np.float64), groups.mean, groups.weight
    count = np.bincount(gw, minlength=workers)
    floor = np.full(workers, np.inf)
    np.minimum.at(floor, gw, mean)
    w, sb, st, sbb, sbt = _moments(gw, b, mean, weight, workers)
    with np.errstate(divide="ignore", invalid="ignore"):
        det = w * sbb - sb * sb
        slope = np.where(det > 0, (w * sbt - sb * st) / det, 0.0)
        slope = np.minimum(0.0, np.maximum(-q, slope))
        s = (st - slope * sb) / w
    first = np.minimum(np.searchsorted(gw, np.arange(workers)), max(len(gw) - 1, 0))
    out: list[tuple[Line, float] | None] = [None] * workers
    for k, n, sl, icpt, lo, one in zip(range(workers), count.tolist(), slope.tolist(), s.tolist(), floor.tolist(),
                                       mean[first].tolist() if len(gw) else [0.0] * workers, strict=True):
        if n == 1:
            out[k] = (Line(0.0, one), lo)
        elif n > 1:
            out[k] = (Line(sl, icpt), lo)
    return out

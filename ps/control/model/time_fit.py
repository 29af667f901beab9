"""A worker's step time as a line in its batch, t(b) = q·b + s, fitted online from what it reports
(Cannikin §3.2.1 and §4.5).

q is the time per sample (data, forward, backward), s the fixed cost of a step (optimizer, Python,
kernel launches, the worker's own part of a push): the part proportional control cannot see.
Observations are grouped by batch size; each group's mean weighs its observations by recency (a
forgetting factor per newer observation of the same worker, so a changed speed takes over), and
the groups enter a weighted least-squares line with inverse-variance weights (a group whose times
scatter counts less, Cannikin's inverse variance weighting). Two batch sizes identify the line;
with one the fit is proportional (s = 0), which is why the model policy probes a second one.

Where the worker overlaps its push with backward and reports the communication left exposed after
its last gradient, that exposed time is fitted the same way and added as Cannikin's two cases
(§3.2.3): a compute-bound worker hides all but the last bucket, a constant floor T_u; a
communication-bound one exposes more, and less the larger its batch (the backward that hides it
grows), down to that floor. Pure and deterministic.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import NamedTuple
from functools import lru_cache

FORGET = 0.9
"""Weight of an observation relative to the next newer one of the same worker (half-life ~7)."""
OLDEST_WEIGHT = 0.05
"""The least weight an observation keeps: an old batch size still anchors the line's slope against
newer ones that cluster at nearly the same batch (a changed speed is handled by rescaling instead)."""
MIN_REL_NOISE = 0.02
"""Floor of a group's relative standard deviation: a few identical times are no proof of no noise."""
ONE_SAMPLE_REL_NOISE = 0.1
"""Relative standard deviation assumed for a group of one observation."""
OUTLIER_MADS = 3.0
"""A time further than this many robust deviations from its group's median is left out of the fit."""
SLOPE_SDS = 2.0
"""A fitted time per sample counts as measured where it stands this many standard errors above zero
(`slope_measured`)."""
CAUTION = 2.0
"""Standard errors of a fitted time added to it where plans are compared (Finish.cautious)."""
BOUND_TOLERANCE = 0.05
"""Exposed communication more than this fraction over its floor counts as communication-bound."""
GROUPS_KEPT = 1 << 14
"""Groups kept for the next fit (a few per worker at thousands of workers): a batch size a worker
left keeps its times, and once they are all OLDEST_WEIGHT old their weights too, so its group is the
same at every fit until the worker comes back to it. Only such groups are kept: one with a younger
time is new at every fit, and keeping it would only keep objects alive for the garbage collector to
walk (half a decision's time at 1,024 workers)."""
RECENCY = [max(OLDEST_WEIGHT, FORGET ** age) for age in range(64)]
"""The weight of an observation by its age, for the ages where it is above OLDEST_WEIGHT and a few
beyond (older ones weigh OLDEST_WEIGHT)."""


class Line(NamedTuple):
    """t(b) = q·b + s in ms (q: ms per sample, s: ms per step), with the covariance of the fitted
    (s, q) where the fit knows it (all zero: exact)."""

    q: float
    s: float
    var_s: float = 0.0
    cov: float = 0.0
    var_q: float = 0.0

    def at(self, batch: float) -> float:
        return self.q * batch + self.s

    def sd(self, batch: float) -> float:
        """The standard error of the fitted time at `batch`: least at the observations' centre, growing
        the farther a prediction extrapolates from them."""
        return math.sqrt(max(0.0, self.var_s + 2.0 * batch * self.cov + batch * batch * self.var_q))

    @property
    def centre(self) -> float:
        """The batch at which the fitted time is best known (where `sd` is least)."""
        return -self.cov / self.var_q if self.var_q > 0 else 0.0

    def scaled(self, factor: float) -> Line:
        f2 = factor * factor
        return Line(self.q * factor, self.s * factor, self.var_s * f2, self.cov * f2, self.var_q * f2)


class Group(NamedTuple):
    """Observations at one batch size: their recency-weighted mean and the weight of that mean."""

    batch: int
    mean: float
    weight: float  # the recency mass over the variance: the inverse variance of the mean, discounted by age
    samples: int


class Finish(NamedTuple):
    """When a worker's push is out at batch b: its step time plus the communication it leaves exposed."""

    line: Line
    exposed: Line | None = None  # the exposed communication's own line (communication-bound part)
    floor: float = 0.0  # the exposed communication of a compute-bound step (the last bucket)

    def at(self, batch: float) -> float:
        """The line's time plus the exposed communication at `batch` (Line.at and `exposed_at` written
        out: a solve prices thousands of workers at dozens of batches)."""
        line, exposed = self.line, self.exposed
        if exposed is None:
            return line.q * batch + line.s + 0.0
        return line.q * batch + line.s + max(self.floor, exposed.q * batch + exposed.s)

    def cautious(self, batch: float) -> float:
        """The finish time at `batch` plus CAUTION standard errors of the fit there, counted from no
        lower than the fit's centre: a plan that moves a worker far above the batches it was measured
        at is priced at what the measurements can vouch for, so noisy fits cannot carry a solve to an
        extreme split. Nondecreasing in the batch, like `at`. Line.sd and Line.centre written out."""
        line = self.line
        cov, var_q = line.cov, line.var_q
        x = max(batch, -cov / var_q if var_q > 0 else 0.0)
        return self.at(batch) + CAUTION * math.sqrt(max(0.0, line.var_s + 2.0 * x * cov + x * x * var_q))

    def exposed_at(self, batch: float) -> float:
        if self.exposed is None:
            return 0.0
        return max(self.floor, self.exposed.at(batch))

    def bound(self, batch: float) -> str:
        """Cannikin's case at `batch`: "compute" or "communication"."""
        if self.exposed is None:
            return "compute"
        return "communication" if self.exposed.at(batch) > self.floor * (1 + BOUND_TOLERANCE) + 1e-6 else "compute"

    def scaled(self, factor: float) -> Finish:
        return Finish(self.line.scaled(factor), self.exposed, self.floor)


class Fit(NamedTuple):
    """A worker's fitted finish time and how many batch sizes back it (2+: the intercept is measured)."""

    finish: Finish
    batches: int  # distinct batch sizes with at least min_samples observations

    @property
    def line(self) -> Line:
        return self.finish.line


def _file(by_batch: dict[int, tuple[list[float], list[float]]], batch: int, weight: float, ms: float) -> None:
    """Put one time and its recency weight with its batch size's."""
    entry = by_batch.get(batch)
    if entry is None:
        by_batch[batch] = ([weight], [ms])
    else:
        entry[0].append(weight)
        entry[1].append(ms)


def _groups(by_batch: dict[int, tuple[list[float], list[float]]]) -> list[Group]:
    """Recency-weighted groups of each batch size's times and their weights, in order of batch size.
    Outliers (a step that waited for a CPU, a collection) are left out of a group of four or more:
    times further from its median than OUTLIER_MADS robust deviations."""
    out = []
    for batch in sorted(by_batch):
        weights, times = by_batch[batch]
        if weights[-1] <= OLDEST_WEIGHT:
            out.append(_kept_group(batch, tuple(weights), tuple(times)))
        else:
            out.append(_group(batch, weights, times))
    return out


def _group(batch: int, observed: Sequence[float], times: Sequence[float]) -> Group:
    """The group of one batch size's times and their recency weights (`_groups`)."""
    weights, kept = _without_outliers(observed, times)
    n = len(kept)
    mass = math.fsum(weights)
    mean = math.fsum(map(operator.mul, weights, kept)) / mass
    if n > 1:
        var = math.fsum([w * (t - mean) ** 2 for w, t in zip(weights, kept)]) / mass * n / (n - 1)
    else:
        var = (ONE_SAMPLE_REL_NOISE * mean) ** 2
    var = max(var, (MIN_REL_NOISE * mean) ** 2, 1e-12)
    # the mean of n observations of variance var has variance var / n; recency discounts n to the mass
    return Group(batch, mean, mass / var, len(times))


_kept_group = lru_cache(maxsize=GROUPS_KEPT)(_group)
"""`_group` kept for the groups that no longer age (GROUPS_KEPT): the newest time's weight, the last, is the floor."""


def _without_outliers(weights: Sequence[float], times: Sequence[float]) -> tuple[Sequence[float], Sequence[float]]:
    """The weights and times within OUTLIER_MADS scaled median absolute deviations of the median
    (at least MIN_REL_NOISE of it), for groups of four or more."""
    if len(times) < 4:
        return weights, times
    ordered = sorted(times)
    median = sorted_median(ordered)
    widest = max(median - ordered[0], ordered[-1] - median)  # the largest deviation: the extremes'
    least = max(MIN_REL_NOISE * abs(median), 1e-9)
    if widest <= OUTLIER_MADS * least:  # within the limit whatever the deviations' median
        return weights, times
    deviations = [abs(t - median) for t in times]
    limit = OUTLIER_MADS * max(1.4826 * sorted_median(sorted(deviations)), least)
    if widest <= limit:
        return weights, times
    inside = [i for i, d in enumerate(deviations) if d <= limit]
    return [weights[i] for i in inside], [times[i] for i in inside]


def sorted_median(ordered: Sequence[float]) -> float:
    """The median of values in order of size."""
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def slope_measured(line: Line) -> bool:
    """Whether the line's time per sample stands SLOPE_SDS standard errors above zero. Times at nearby
    batch sizes can tilt a line flat (q near 0, nearly all the time fixed) by their noise alone; such
    a line's fixed cost is no measurement, and a break-even batch from it (s/q) can be any size."""
    return line.q > SLOPE_SDS * math.sqrt(line.var_q)


def weighted_line(points: Sequence[Group]) -> Line | None:
    """Weighted least squares over the groups; q > 0 and s >= 0 (a noisy pair of points must not give
    a negative time per sample or per step). One group: the proportional line through it; none: None."""
    if not points:
        return None
    if len(points) == 1:
        p = points[0]
        return Line(p.mean / p.batch, 0.0, var_q=1.0 / (p.weight * p.batch * p.batch))
    w, sb, st, sbb, sbt = _moments(points)
    det = w * sbb - sb * sb
    # the weights are inverse variances, so (X'WX)^-1 is the covariance of the fitted (s, q)
    var_s, cov, var_q = (sbb / det, -sb / det, w / det) if det > 0 else (1.0 / w, 0.0, 0.0)
    q = _slope(w, sb, st, sbb, sbt)
    if q <= 0:  # times that fall with the batch: only noise can say so; a nearly flat line
        q = 1e-6 * st / sb
    s = (st - q * sb) / w
    if s < 0:  # a negative fixed cost: the best line through the origin
        s, q = 0.0, sbt / sbb
        var_s, cov, var_q = 0.0, 0.0, 1.0 / sbb
    return Line(q, s, var_s, cov, var_q)


def _moments(points: Sequence[Group]) -> tuple[float, float, float, float, float]:
    """The weighted sums of 1, b, t, b² and b·t over the groups."""
    return (math.fsum(p.weight for p in points), math.fsum(p.weight * p.batch for p in points),
            math.fsum(p.weight * p.mean for p in points), math.fsum(p.weight * p.batch * p.batch for p in points),
            math.fsum(p.weight * p.batch * p.mean for p in points))


def _slope(w: float, sb: float, st: float, sbb: float, sbt: float) -> float:
    """The weighted least-squares slope of t over b from the groups' moments (0 when they share one batch)."""
    det = w * sbb - sb * sb
    return (w * sbt - sb * st) / det if det > 0 else 0.0


def exposed_line(points: Sequence[Group], slope_floor: float) -> tuple[Line, float] | None:
    """The exposed communication's line and its floor (the smallest group mean: the last bucket of a
    compute-bound step), its slope within [-slope_floor, 0]: exposure never grows with the batch, and
    never falls faster than the step time grows (the finish time stays nondecreasing in b)."""
    if not points:
        return None
    floor = min(p.mean for p in points)
    if len(points) == 1:
        return Line(0.0, points[0].mean), floor
    w, sb, st, sbb, sbt = _moments(points)
    slope = min(0.0, max(-slope_floor, _slope(w, sb, st, sbb, sbt)))
    return Line(slope, (st - slope * sb) / w), floor


def fit_of(items: Sequence[tuple[int, int, float, float | None]], min_samples: int) -> Fit | None:
    """The fit of observations (sequence number, batch, ms, exposed ms or None), oldest first, each
    weighed by its age behind the newest; None without any. `min_samples`: the observations a batch
    size needs to count as measured (Fit.batches)."""
    if not items:
        return None
    last, ages = items[-1][0], len(RECENCY)
    by_batch: dict[int, tuple[list[float], list[float]]] = {}
    exposed_by_batch: dict[int, tuple[list[float], list[float]]] = {}
    for seq, b, ms, e in items:  # the times and the exposed times, by batch size in one pass
        age = last - seq
        weight = RECENCY[age] if age < ages else OLDEST_WEIGHT
        _file(by_batch, b, weight, ms)
        if e is not None:
            _file(exposed_by_batch, b, weight, e)
    points = _groups(by_batch)
    line = weighted_line(points)
    if line is None:
        return None
    exposed = exposed_line(_groups(exposed_by_batch), line.q)
    finish = Finish(line) if exposed is None else Finish(line, exposed[0], exposed[1])
    return Fit(finish, sum(1 for p in points if p.samples >= min_samples))

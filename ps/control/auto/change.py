"""Whether a worker's speed changed: its newest step times left the law fitted to its times before
them by more than the noise, for a few rounds in a row (OmniLearn's dynamic heterogeneity, where a
Cannikin-style fit describes the past). Pure.

A worker's observations (model/observations.Observations' items: sequence number, batch, ms, exposed
ms) are split at a mark: those before it are settled, the law is fitted to them; the newest ones are
tested against it. The newest WINDOW stay unsettled, so a change is judged on up to that many rounds
after it; older ones settle into the law (law.py). Where the law is the proportional line through
one batch size b0, a time at batch b may be off it by a fixed cost not measured yet, not a change:
slower by up to b0/b - 1 below b0, faster above it; only what is beyond that counts.

A change is the suffix of the tested times whose median is off the law by BANDS deadbands or more and
by CHANGE_SDS standard errors (the times' noise, estimated robustly from the settled times, and the
law's own error at that batch: the fit's, or a least-squares line's at that noise if larger; both
count the noise's persistence, spells of load that move several times together), the newest
CHANGE_ROUNDS of them all off on the same side (one or two where each is QUICK's ratio off); of such
suffixes, the one that stands out most (the likeliest start of the change), less its first times
nearer the law than the shift (from before the change). CHANGE_ROUNDS times must be left after the
change (QUICK's fewer): one event often moves several workers, and the decision that follows sees
them all.
"""

from __future__ import annotations

import bisect
import math
import operator
import statistics
from collections.abc import Callable, Sequence
from functools import lru_cache

from ps.control.auto.law import Law, law_of
from ps.control.model.item_rows import Item
from ps.control.model.time_fit import GROUPS_KEPT, sorted_median

CHANGE_ROUNDS = 3
"""The fewest newest times, all off the law on one side, that make a change."""
QUICK = ((4.0, 1), (2.5, 2))
"""Fewer newest times make a change when each is this many times off the law (slower, or faster by
its inverse): a quota cut to an eighth makes every round eight times longer until the plan follows,
so its first time is trusted at once. A stalled step (twice as long, now and then, on a shared
machine) in a spell of load stays below these; two in a row below the second."""
WINDOW = 8
"""The newest observations kept unsettled: a change is judged on up to this many rounds after it."""
SETTLE_EVERY = 2
"""The settled observations grow this many at a time (the newest WINDOW to WINDOW + SETTLE_EVERY - 1
stay unsettled): each growth fits the settled law again, and fitting it after every push was half of
the policy's CPU a round at a thousand workers."""
CHANGE_SDS = 4.5
"""A change is off the law by at least this many standard errors of its median."""
PRIOR_NOISE = 0.1
"""The relative noise of a step time assumed before the settled times say (a shared CPU's)."""
PRIOR_WEIGHT = 3
"""How many observations that assumption counts as."""
BANDS = 2.0
"""A change is off the law by at least this many deadbands: a smaller one would not move the plan, and
the recency weights of the law's fit follow it anyway."""
ALONG_SDS = 2.5
"""When one worker changed, another off its law by this many standard errors (and the deadband) over
ALONG_ROUNDS rounds changed along with it: one event (a tenant, a quota) often moves several."""
ALONG_ROUNDS = 3
"""The fewest newest times that make a change along with another worker's."""
ALONG_TESTS = ((ALONG_SDS, ALONG_ROUNDS), (ALONG_SDS, 1))
"""The tests a decision puts the workers that did not change to, as (sds, rounds) of `change_start`:
on ALONG_ROUNDS newest times, or on the newest alone where a change was trusted on its first times
(the others' rounds since are as few)."""
STALL = 0.5
"""A time's relative deviation counts for the noise up to this much (a stalled step, not noise)."""
MAX_CORRELATION = 0.9
"""The most lag-one correlation of the noise that is counted (a spell of load lasting ~20 rounds)."""
MEDIAN_EFFICIENCY = 1.2533
"""The standard error of a median over that of a mean, under normal noise (sqrt(pi / 2))."""


def change_start(items: Sequence[Item], settled: int, min_samples: int, deadband: float,
                 sds: float = CHANGE_SDS, rounds: int = CHANGE_ROUNDS,
                 settled_law: Callable[[Sequence[Item], int], Law | None] | None = None) -> int | None:
    """The sequence number of the first time after a change of speed (`items` oldest first; those
    numbered below `settled` are the law's), or None where the newest times agree with the law:
    `rounds` of them at least, off by `sds` standard errors. `settled_law`: the law of the first
    so many items, the settled ones, where the caller keeps it (law.law_of's, with `min_samples`)."""
    return change_starts(items, settled, min_samples, deadband, ((sds, rounds),), settled_law)[0]


def change_starts(items: Sequence[Item], settled: int, min_samples: int, deadband: float,
                  tests: Sequence[tuple[float, int]],
                  settled_law: Callable[[Sequence[Item], int], Law | None] | None = None) -> list[int | None]:
    """`change_start` for each (sds, rounds) of `tests`, from one pass over the times: the residuals,
    the noise and the medians of the newest times are the same for every test, only the bar differs
    (a push's own test and the laxer one a decision puts the other workers to)."""
    none: list[int | None] = [None] * len(tests)
    split = bisect.bisect_left(items, settled, key=operator.itemgetter(0))  # oldest first: numbered in order
    tail = items[split:]
    if not tail:  # QUICK's fewest is one time
        return none
    law = law_of(items[:split], min_samples) if settled_law is None else settled_law(items, split)
    if law is None:
        return none
    line = law.fit.line
    q, s = line.q, line.s  # Line.at written out: every worker is tested at a decision
    if law.batch is None:
        residuals = [ms / (q * b + s) - 1.0 for _, b, ms, _ in tail]
    else:
        residuals = [_unexplained(ms / (q * b + s) - 1.0, law.batch / b) for _, b, ms, _ in tail]
    floor = BANDS * deadband
    if all(abs(r) < floor for r in residuals):  # no median of them reaches the floor: the noise is not needed
        return none
    before = items[:split]
    noise, runs = noise_and_persistence(before)
    batch = tail[-1][1]
    used = before if law.known else [it for it in before if it[1] == law.batch]
    # the settled times may all have been dropped since their law was kept: its line's own error then
    fit_error = max(line.sd(batch) / line.at(batch),
                    law_error(used, batch, noise, law.known) * math.sqrt(min(runs, len(used))) if used else 0.0)
    # by the shift's side, for each test
    needs = [(needed_rounds(residuals, -1.0, rounds), needed_rounds(residuals, 1.0, rounds)) for _, rounds in tests]
    fewest = min(min(need) for need in needs)
    best: list[tuple[float, int, float, int] | None] = [None] * len(tests)
    newest: list[float] = []  # residuals[-m:], in order of size
    for m in range(1, len(tail) + 1):
        bisect.insort_left(newest, residuals[-m])  # an older equal residual first, as sorted() orders them
        shift = sorted_median(newest)
        if m < fewest or abs(shift) < floor:
            continue
        error = math.sqrt((MEDIAN_EFFICIENCY * noise) ** 2 * min(runs, m) / m + fit_error ** 2)
        score = abs(shift) / error
        for i, (sds, _) in enumerate(tests):
            needed = needs[i][shift > 0]
            found = best[i]
            if (m >= needed and score >= sds and (found is None or score > found[0])
                    and all(r * shift > 0 for r in residuals[-needed:])):
                best[i] = (score, m, shift, needed)
    starts = none[:]
    for i, found in enumerate(best):
        if found is None:
            continue
        _, m, shift, needed = found
        first = len(tail) - m
        while first < len(tail) and abs(residuals[first]) < abs(residuals[first] - shift):  # nearer the law: before it
            first += 1
        starts[i] = tail[first][0] if len(tail) - first >= needed else None
    return starts


def needed_rounds(residuals: Sequence[float], shift: float, rounds: int) -> int:
    """How many of the newest times (relative residuals, oldest first) a change of `shift` needs:
    `rounds`, or fewer where each of the newest that many is QUICK's ratio off the law on its side."""
    for ratio, quick in QUICK:
        newest = residuals[-quick:]
        if quick < rounds and len(newest) == quick and all(
                (1.0 + r >= ratio) if shift > 0 else (1.0 + r <= 1.0 / ratio) for r in newest):
            return quick
    return rounds


def _unexplained(residual: float, ratio: float | None) -> float:
    """The part of a time's relative residual that no fixed cost explains: off a proportional line
    through batch b0, a fixed cost makes a time at batch b slower by up to b0/b - 1 below b0, faster
    by up to that above it (`ratio`: b0/b; None: the law is known, all of it counts)."""
    if ratio is None:
        return residual
    lo, hi = sorted((0.0, ratio - 1.0))
    return residual - min(max(residual, lo), hi)


def settled_mark(items: Sequence[Item], settled: int) -> int:
    """The new mark after a test that found no change: once WINDOW + SETTLE_EVERY observations are
    unsettled, every one but the newest WINDOW settles."""
    if len(items) < WINDOW + SETTLE_EVERY or items[-WINDOW - SETTLE_EVERY][0] < settled:
        return settled
    return items[-WINDOW][0]  # newer than the mark: an older one is at or past it


def relative_noise(items: Sequence[Item]) -> float:
    """The relative noise of the times: the pooled standard deviation of each time about the median of
    its batch size (each deviation clipped at STALL, so one stalled step does not blind the test for
    long), pooled with PRIOR_NOISE counted PRIOR_WEIGHT times."""
    return noise_and_persistence(items)[0]


def persistence(items: Sequence[Item]) -> float:
    """How many times one draw of the noise lasts: (1 + ρ) / (1 - ρ), ρ the lag-one correlation of
    the times' deviations from their batch size's median, in order, 0 <= ρ <= MAX_CORRELATION. A
    machine's load comes in spells (another process, a collection), and the mean of m times that
    move together is known only as well as that of m over this many independent ones."""
    return noise_and_persistence(items)[1]


def noise_and_persistence(items: Sequence[Item]) -> tuple[float, float]:
    """`relative_noise` and `persistence` of the times, from one pass over their deviations from
    their batch size's median."""
    by_batch: dict[int, list[float]] = {}
    for _, b, ms, _ in items:
        by_batch.setdefault(b, []).append(ms)
    squares, dof = 0.0, 0
    products = spread = 0.0
    for times in by_batch.values():
        sums = _deviation_sums(tuple(times))
        if sums is not None:
            squares += sums[0]
            dof += len(times) - 1
            if len(times) > 2:
                products += sums[1]
                spread += sums[2]
    rho = min(MAX_CORRELATION, max(0.0, products / spread)) if spread > 0 else 0.0
    return math.sqrt((PRIOR_WEIGHT * PRIOR_NOISE ** 2 + squares) / (PRIOR_WEIGHT + dof)), (1.0 + rho) / (1.0 - rho)


@lru_cache(maxsize=GROUPS_KEPT)  # a batch size a worker left keeps its times
def _deviation_sums(times: tuple[float, ...]) -> tuple[float, float, float] | None:
    """Of one batch size's times' relative deviations from their median: the sum of their squares
    clipped at STALL, and (three times or more) the sum of lag-one products and of squares of the
    deviations clipped to ±STALL; None for one time or a median of 0."""
    centre = statistics.median(times)
    if not (len(times) > 1 and centre > 0):
        return None
    deviations = [t / centre - 1.0 for t in times]
    squares = sum(min(abs(d), STALL) ** 2 for d in deviations)
    if len(times) <= 2:
        return squares, 0.0, 0.0
    dev = [max(-STALL, min(d, STALL)) for d in deviations]
    return squares, sum(a * b for a, b in zip(dev, dev[1:])), sum(d * d for d in dev)


def law_error(items: Sequence[Item], batch: int, noise: float, known: bool) -> float:
    """The relative standard error of a law's prediction at `batch` from the times `items` of relative
    noise `noise`: a least-squares line's through every batch size (known), the mean's at the
    proportional line's batch size otherwise."""
    batches = [b for _, b, _, _ in items]
    if not known:
        return noise / math.sqrt(max(1, sum(1 for b in batches if b == batches[-1])))
    centre = statistics.fmean(batches)
    spread = sum((b - centre) ** 2 for b in batches)
    return noise * math.sqrt(1.0 / len(batches) + ((batch - centre) ** 2 / spread if spread > 0 else 0.0))

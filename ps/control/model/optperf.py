"""OptPerf (Cannikin §3.3, §4.2) beyond the best split of B (ps/control/performance.py's `split`):
whether a worker should be parked, and the split nearest the plan in force among the near-optimal.

A round takes T = max_i f_i(b_i) + c (performance.py). A worker whose fixed cost alone exceeds the
round the others reach without it can only slow the round down at any batch b >= 1; `best_plan`
compares the round with it held at its share (its minimum batch, at worst) against the round with it
parked (b = 0, its share moved to the others) and takes the shorter; the best set to park is always
the workers slowest at their minimum batch.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping

import numpy as np

from ps.control.model.break_even import carrying
from ps.control.model.finish_table import table_of
from ps.control.performance import CallTable, FinishTable, FinishTime, FittedRounds, round_time, split
from ps.control.split import fit_to_sum, reachable


def best_plan(
    times: Mapping[str, FinishTime],
    total: int,
    lower: Mapping[str, int],
    upper: Mapping[str, int],
    *,
    may_park: Iterable[str] = (),
    overhead: float = 0.0,
    min_gain: float = 0.0,
    prefer: Iterable[str] = (),
    table: FinishTable | None = None,
) -> tuple[dict[str, int], list[str], dict[str, float]]:
    """The split with the shortest predicted round, parking workers of `may_park` where that pays.

    At a round time T a worker can take part only if it finishes its minimum batch within T, and every
    worker that can only adds capacity; so the best parked set is always the candidates slowest at
    their minimum batch, a prefix of them in that order. Each prefix is solved (`split` over the
    rest) and the shortest round is taken if it beats the round with everyone in by more than
    `min_gain` (a fraction). Workers of `prefer` (those parked now) count `min_gain` slower in that
    order, so a near-tie keeps the same workers parked. Returns the plan (parked workers at 0), the parked workers (slowest
    first), and the predicted rounds compared: {"held": T with every worker in, "parked": T with the
    best prefix out} (empty when nobody was a candidate, or when every worker finishes its minimum
    batch within the round with everyone in: no parking can shorten it then). `table`: `times` as a
    FinishTable where the caller has one (finish_table.table_of's).
    """
    # every worker priced at once where they are laws
    table = table if table is not None else table_of(times) or CallTable(list(times.values()))
    model = FittedRounds(times, overhead, table=table)
    plan = split(times, total, lower, upper, table)
    held = model.predict(plan)
    favoured = set(prefer)
    at_min = dict(zip(times, table.at(np.array([lower[k] for k in times], dtype=np.int64)).tolist()))
    # a worker its bounds hold at 0 runs no step: its time is in no round, parked or not
    runs_min = {k: t if upper[k] > 0 else -math.inf for k, t in at_min.items()}
    if max(runs_min.values(), default=math.inf) + model.overhead_ms < held:
        # every worker finishes its minimum within the round everyone makes: a split of fewer, with the
        # parked at their minimum, is a split of all no slower, so parking cannot shorten the round
        return plan, [], {}
    order = sorted((k for k in dict.fromkeys(may_park) if k in times),
                   key=lambda k: at_min[k] * (1.0 + min_gain if k in favoured else 1.0), reverse=True)
    trial = _best_prefix(times, order, total, lower, upper, model, table, runs_min)
    if trial is None:
        return plan, [], {}
    compared = {"held": held, "parked": trial[0]}
    if not trial[0] * (1.0 + min_gain) < held:  # shorter by more than min_gain of itself, as model.py's gain
        return plan, [], compared
    return {**dict.fromkeys(times, 0), **trial[2]}, trial[1], compared


def _best_prefix(times: Mapping[str, FinishTime], order: list[str], total: int, lower: Mapping[str, int],
                 upper: Mapping[str, int], model: FittedRounds, table: FinishTable,
                 at_min: Mapping[str, float]) -> tuple[float, list[str], dict[str, int]] | None:
    """The first n whose prefix order[:n] parked gives the shortest predicted round (its round, the
    prefix and the split of the rest), over the n whose rest can make up `total`; None if none can.

    With the prefix of n parked, the rest's best round is V(n) = max(A(n), L(n)): A(n) the slowest of
    the rest at its minimum batch (every worker in takes at least that), nonincreasing in n, and L(n)
    the least level whose caps over the rest add up to `total`, nondecreasing in n (fewer workers, less
    room at every level). So V(n) > A(n) from some n_c on and not before: V(n) = A(n) before n_c and is
    least at its first n equal to A(n_c - 1); from n_c on V(n) = L(n) is least at n_c. A binary search
    finds n_c, and two splits price the two candidates: O(n log n) evaluations of the finish times
    instead of a split for every prefix (n splits, minutes at thousands of workers). `table`: `times`
    as a FinishTable (rows in their keys' order), `at_min` each one's time at its lower bound (−inf for
    a worker whose upper bound is 0: it takes no part in any round, so it sets no round's floor)."""
    rest_lower = sum(lower[k] for k in times)
    rest_upper = sum(upper[k] for k in times)
    parkable = set(order)
    outside = [k for k in times if k not in parkable]
    row = {k: i for i, k in enumerate(times)}
    lows = np.array([lower[k] for k in times], dtype=np.int64)
    highs = np.array([upper[k] for k in times], dtype=np.int64)
    outside_rows = np.array([row[k] for k in outside], dtype=np.int64)
    order_rows = np.array([row[k] for k in order], dtype=np.int64)
    # feasible[n]: the rest of prefix n can make up `total` (and is not empty)
    feasible: list[bool] = [False]
    for n, k in enumerate(order, start=1):
        rest_lower -= lower[k]
        rest_upper -= upper[k]
        feasible.append(rest_lower <= total <= rest_upper and (n < len(times)))
    sizes = [n for n in range(1, len(order) + 1) if feasible[n]]
    if not sizes:
        return None
    first, last = sizes[0], sizes[-1]  # the bounds' sums are monotone in n: an interval
    slowest = [0.0] * (len(order) + 2)  # A(n): the slowest at its minimum of order[n:] and the others
    floor = max((at_min[k] for k in outside), default=-math.inf)
    for n in range(len(order) - 1, -1, -1):
        slowest[n] = max(at_min[order[n]], slowest[n + 1] if n + 1 < len(order) else floor)
    slowest[len(order)] = floor

    def above_slowest(n: int) -> bool:  # V(n) > A(n): the rest's caps at A(n) fall short of `total`
        rows = np.concatenate([outside_rows, order_rows[n:]])
        return int(table.within(slowest[n], lows[rows], highs[rows], rows).sum()) < total

    lo, hi = first, last + 1  # n_c in [first, last + 1]; last + 1: V(n) = A(n) everywhere
    while lo < hi:
        mid = (lo + hi) // 2
        if above_slowest(mid):
            hi = mid
        else:
            lo = mid + 1
    picks = []
    if lo > first:  # the first n before n_c whose round equals A(n_c - 1)'s
        level = slowest[lo - 1] + model.overhead_ms
        picks.append(next(n for n in range(first, lo) if slowest[n] + model.overhead_ms == level))
    if lo <= last:
        picks.append(lo)
    trial: tuple[float, list[str], dict[str, int]] | None = None
    for n in picks:
        out = set(order[:n])
        rest = [j for j in times if j not in out]
        p = split({j: times[j] for j in rest}, total, lower, upper,
                  table.take(np.array([row[j] for j in rest], dtype=np.int64)))
        t = model.predict(p)
        if trial is None or t < trial[0]:
            trial = (t, order[:n], p)
    return trial


OUTLASTING_TRIALS = 4
"""The sets of latest workers `outlasting` prices parked (the latest one, two, ... and all of them)."""


def outlasting(means: Mapping[str, float], plan: Mapping[str, int], times: Mapping[str, FinishTime], total: int,
               lower: Mapping[str, int], upper: Mapping[str, int], *, measured_round: float, overhead: float,
               margin: float, share: float) -> list[str]:
    """The workers of `plan` to price parked by the measured round: those with at most `share` of
    `total` whose measured mean finish (`means`) is later by more than `margin` than that of the worker
    with the largest batch (which carries the round; never among them), latest first, the fewest of
    them whose parking predicts the round the others make without them (the best split of `total`
    over the rest by `times`, plus `overhead`) shorter than `measured_round` by more than `margin` of
    it; [] where none does.

    A worker kept at a few samples whose fixed cost sets the round is parked by the measured round,
    not by its fit alone: one whose time barely grows with its batch fits flat, or below what it
    measures, and a re-solve that may only halve a batch takes one decision a halving to bring it to
    the minimum batch it parks from. Only small shares: their samples moved to the others raise those
    by little more than `share`, where the others' fits are measured, while a worker with a larger
    share late after a change of speed is re-balanced, not parked (its measured round is no measure of
    the plan that keeps it at a smaller batch)."""
    active, carrier = [k for k, b in plan.items() if b > 0], carrying(plan)
    if carrier is None or len(active) < 2 or any(k not in means for k in active):
        return []
    late = sorted((k for k in active if means[k] > (1.0 + margin) * means[carrier] and plan[k] <= share * total),
                  key=means.__getitem__, reverse=True)
    if not late:
        return []
    sizes = sorted({*range(1, min(len(late), OUTLASTING_TRIALS) + 1), len(late)})
    priced = {k: times[k] for k in active}
    table = table_of(priced) or CallTable(list(priced.values()))  # every worker priced at once, once
    row = {k: i for i, k in enumerate(priced)}
    for n in sizes:
        out = set(late[:n])
        rest = [k for k in active if k not in out]
        if not reachable(rest, total, lower, upper):
            continue
        others = {k: times[k] for k in rest}
        rows = table.take(np.array([row[k] for k in rest], dtype=np.int64))
        without = split(others, total, lower, upper, rows)
        if (round_time(others, without, rows) + overhead) * (1.0 + margin) < measured_round:
            return late[:n]
    return []


def nearest_plan(times: Mapping[str, FinishTime], plan: Mapping[str, int], current: Mapping[str, int],
                 lower: Mapping[str, int], upper: Mapping[str, int], slack: float,
                 idle: Collection[str] = (), band: float = 0.0) -> dict[str, int]:
    """Among the splits of `plan`'s total over `plan`'s workers (the same ones parked) whose round is
    within `slack` (a fraction) of `plan`'s, one nearest the plan in force: each worker's share of
    `current` (a worker not in it keeps its batch in `plan`), scaled to the total and held under the
    largest batch it finishes within that round. Where a fixed cost dominates, many splits predict
    nearly the same round, and the optimum among them moves with every wobble of the fits; this
    keeps what the workers run at unless the fits ask for more. A worker of `idle` (measured finishing
    early) that `times` too finish at its batch in `current` earlier than `plan`'s round by more than
    `band` of it takes its batch in `plan` instead (else no worker is raised but to fill the total:
    one that only finishes early costs the round little, however much of its own time it idles)."""
    newcomers = {k: b for k, b in plan.items() if b > 0 and current.get(k, 0) <= 0}
    stay = [k for k, b in plan.items() if b > 0 and k not in newcomers]
    if not stay:
        return dict(plan)
    planned = round_time(times, plan)
    level = planned * (1.0 + slack)
    staying = {k: times[k] for k in stay}
    table = table_of(staying) or CallTable(list(staying.values()))
    within = table.within(level, np.array([lower[k] for k in stay], dtype=np.int64),
                          np.array([upper[k] for k in stay], dtype=np.int64))
    caps = {k: max(plan[k], b) for k, b in zip(stay, within.tolist(), strict=True)}
    target = {k: float(min(max(current[k], lower[k], 1), caps[k])) for k in stay}
    if idle:
        short = planned * (1.0 - band)
        target.update({k: float(plan[k]) for k in idle
                       if k in target and plan[k] > current[k] and times[k](current[k]) < short})
    kept = fit_to_sum(target, sum(plan[k] for k in stay), {k: lower[k] for k in stay}, caps)
    return {**{k: 0 for k in plan}, **newcomers, **kept}

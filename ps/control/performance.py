"""The one model of a round's time: the predicted round (ms) of a plan, and of a global batch B,
fitted from what was measured. The model policy's decisions and the predictions its `adjust` records
carry, --adaptive-batch's choice of B (through the policy's `predicted_round_ms`) and its fallbacks
all predict through here.

A BSP round takes T = max_i f_i(b_i) + c: every worker's finish time f_i at its batch and the
round's overhead c (what the server and the wire add after the last push). The estimator depends on
what has been measured, each documented for its case behind one interface (`RoundModel`):

- `FittedRounds` ("model"): the model policy's fitted finish times (model/time_fit.py) and its
  measured c; a plan's round is the slowest finish plus c, a B's round that of the best split of B
  (`split`, Cannikin's OptPerf);
- `LineRounds` ("line", `round_line`): for a policy without fits, T(B) = a + c·B through the median
  rounds measured at two or more global batches;
- `ScaledRounds` ("guess", `measured_round`): with rounds measured at one B only, the slowest
  worker's smoothed time scaled with B plus what the round added beyond it (it counts fixed costs as
  per-sample time, so a caller trusts it upward only).

`global_round_model` picks among them for --adaptive-batch. Pure: no clock, no I/O.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import numpy as np

FinishTime = Callable[[int], float]
"""A worker's predicted finish time (ms) at a batch; nondecreasing."""

_BISECTIONS = 64


def split(times: Mapping[str, FinishTime], total: int, lower: Mapping[str, int],
          upper: Mapping[str, int], table: FinishTable | None = None) -> dict[str, int]:
    """Integers within [lower, upper] summing to `total` that minimise max_i times[i](b_i): the best
    split of B (Cannikin's OptPerf). For compute-bound workers the optimum finishes them together
    (Cannikin Appendix A.1): in the continuous limit b_i = (μ − s_i)/q_i with μ = (B + Σ s_i/q_i) /
    Σ 1/q_i. Here it is solved on integers for any nondecreasing f_i: each unit of B goes to the worker
    that would finish it soonest (exact for min-max with nondecreasing costs), after a search on T
    has placed all but about one unit a worker at once (where a plateau of flat or quantised laws
    leaves more, `fill` places the rest in bulk); bounds are water levels the fill cannot cross.
    `table`: the same times as a FinishTable, rows in the order of `times`' keys (a solve's searches
    then price every worker at once; without it, each is called).

    Requires sum(lower) <= total <= sum(upper) (ValueError otherwise). Ties go to the first key.
    """
    keys = list(times)
    lo = np.array([lower[k] for k in keys], dtype=np.int64)
    hi = np.array([upper[k] for k in keys], dtype=np.int64)
    if int(lo.sum()) > total or int(hi.sum()) < total:
        raise ValueError(f"infeasible split of {total}: bounds sum to [{int(lo.sum())}, {int(hi.sum())}]")
    left = total - int(lo.sum())
    if left == 0 or not keys:
        return dict(zip(keys, lo.tolist()))
    table = CallTable(list(times.values())) if table is None else table
    # place most units at once: a level T whose caps fit in `total` with at most one unit a worker
    # left over. The caps' sum is nearly linear in T, so T is found by false position (Illinois: an
    # end kept twice has its residual halved; every fourth step bisects), and each worker's cap is
    # searched between its caps at the two ends only (caps grow with T)
    low, high = float(table.at(lo).min()), float(table.at(hi).max())
    best, ceiling = lo, hi
    aim = total - len(keys) / 2
    placed = int(best.sum())
    below, above = placed - aim, int(ceiling.sum()) - aim
    kept = 0  # +1: the low end moved last, -1: the high end
    for step in range(_BISECTIONS):
        if total - placed <= len(keys) or high - low <= 1e-9 * max(1.0, abs(high)):
            break
        level = low - below * (high - low) / (above - below) if step % 4 != 3 and above > below else (low + high) / 2
        if not low < level < high:
            level = (low + high) / 2
        caps = table.within(level, best, ceiling)
        capped = int(caps.sum())
        if capped <= total:
            best, low, below, placed = caps, level, capped - aim, capped
            above, kept = (above / 2 if kept == 1 else above), 1
        else:
            ceiling, high, above = caps, level, capped - aim
            below, kept = (below / 2 if kept == -1 else below), -1
    left = total - placed
    if left > _BISECTIONS * len(keys):  # a plateau (a flat or quantised law) left too many for the heap
        return dict(zip(keys, fill(table, best, hi, left).tolist()))
    plan = best.tolist()
    # the rest one unit at a time, each to the worker that finishes it soonest: the units of least
    # finish in order, from any level's caps the same plan
    room = np.flatnonzero(best < hi)
    bound = hi.tolist()
    heap = list(zip(table.at(best[room] + 1, room).tolist(), room.tolist()))
    heapq.heapify(heap)
    funcs = list(times.values())
    while left > 0:
        _, i = heapq.heappop(heap)
        plan[i] += 1
        left -= 1
        if plan[i] < bound[i]:
            heapq.heappush(heap, (funcs[i](plan[i] + 1), i))
    return dict(zip(keys, plan))


def fill(table: FinishTable, plan: np.ndarray, upper: np.ndarray, left: int) -> np.ndarray:
    """`plan` plus the `left` units of least finish above it within `upper`, ties to the first row:
    what handing them out one at a time to the worker that finishes the next soonest places (finish
    times nondecreasing), in at most 68 pricings of every row however many units are left.
    The level of the last unit placed is the least float whose units above `plan` number `left` or
    more (a bisection over the floats' order); the units below it all go, those at it by row."""
    room = np.flatnonzero(plan < upper)
    if left <= 0 or not room.size:
        return plan.copy()
    rows, lo, hi = table.take(room), plan[room], upper[room]

    def placed(level: float) -> int:
        return int((rows.within(level, lo, hi) - lo).sum())

    # no unit finishes below the cheapest first unit, all of them by the dearest last unit
    below, at = _ordered(float(rows.at(lo + 1).min())) - 1, _ordered(float(rows.at(hi).max()))
    while at - below > 1:
        mid = (below + at) // 2
        below, at = (below, mid) if placed(_unordered(mid)) >= left else (mid, at)
    level = _unordered(at)
    under = rows.within(math.nextafter(level, -math.inf), lo, hi) if level > -math.inf else lo
    tied = rows.within(level, lo, hi) - under
    rest = left - int((under - lo).sum())
    out = plan.copy()
    out[room] = under + np.clip(rest - (np.cumsum(tied) - tied), 0, tied)
    return out


_SIGN = 1 << 63


def _ordered(x: float) -> int:
    """The float `x` as an integer in the floats' order (adjacent floats are adjacent integers)."""
    bits = int(np.float64(x).view(np.int64))
    return bits if bits >= 0 else -(bits + _SIGN) - 1


def _unordered(i: int) -> float:
    """The float that `_ordered` maps to `i`."""
    bits = i if i >= 0 else -(i + 1) - _SIGN
    return float(np.int64(bits).view(np.float64))


class FinishTable(Protocol):
    """Workers' finish times, one row each, priced many at once: the values their FinishTime calls
    give, bit for bit (model/finish_table.py holds the fitted laws as arrays; `CallTable` calls any)."""

    def at(self, batches: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """Each row's finish time at its batch (`rows`: those rows only, in that order)."""

    def within(self, level: float, lo: np.ndarray, hi: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """`batch_within` of each row: the largest batch in [lo, hi] it finishes by `level`."""

    def take(self, rows: np.ndarray) -> FinishTable:
        """The table of these rows, in this order."""


@dataclass(frozen=True)
class CallTable:
    """A FinishTable of any finish times: each called once a batch."""

    times: list[FinishTime]

    def at(self, batches: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        times = self.times if rows is None else [self.times[r] for r in rows.tolist()]
        return np.array([t(b) for t, b in zip(times, batches.tolist(), strict=True)], dtype=np.float64)

    def within(self, level: float, lo: np.ndarray, hi: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        times = self.times if rows is None else [self.times[r] for r in rows.tolist()]
        return np.array([lo_ if lo_ == hi_ else batch_within(t, level, lo_, hi_)
                         for t, lo_, hi_ in zip(times, lo.tolist(), hi.tolist(), strict=True)], dtype=np.int64)

    def take(self, rows: np.ndarray) -> CallTable:
        return CallTable([self.times[r] for r in rows.tolist()])


def batch_within(time: FinishTime, level: float, lo: int, hi: int) -> int:
    """The largest b in [lo, hi] with time(b) <= level (lo when even lo is over it). Finish times are
    near lines in b: the search starts at the batch a line through the two ends puts at `level`,
    gallops outwards to a bracket of the answer and bisects it (a few calls where the line holds,
    O(log(hi - lo)) at worst)."""
    t_hi = time(hi)
    if t_hi <= level:
        return hi
    t_lo = time(lo)
    if t_lo > level:
        return lo
    # time(lo) <= level < time(hi)
    guess = lo + int((level - t_lo) / (t_hi - t_lo) * (hi - lo)) if t_hi > t_lo else lo
    guess = min(max(guess, lo), hi - 1)
    step = 1
    if guess == lo or time(guess) <= level:
        lo = guess
        while lo + step < hi and time(lo + step) <= level:
            lo += step
            step *= 2
        hi = min(hi, lo + step)
    else:
        hi = guess
        while hi - step > lo and time(hi - step) > level:
            hi -= step
            step *= 2
        lo = max(lo, hi - step)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if time(mid) <= level:
            lo = mid
        else:
            hi = mid
    return lo


def round_time(times: Mapping[str, FinishTime], plan: Mapping[str, int], table: FinishTable | None = None) -> float:
    """The slowest finish among the workers with a batch (0 when none has one). `table`: the same
    times as a FinishTable, rows in the order of `times`' keys (every worker priced at once)."""
    if table is not None:
        batches = np.array([plan.get(k, 0) for k in times], dtype=np.int64)
        active = np.flatnonzero(batches > 0)
        if active.size == sum(1 for b in plan.values() if b > 0):  # else a planned worker has no time: as below
            return float(table.at(batches[active], active).max()) if active.size else 0.0
    return max((times[k](b) for k, b in plan.items() if b > 0), default=0.0)




class RoundModel(Protocol):
    """A round's predicted time at a global batch, and which estimator gives it."""

    basis: ClassVar[str]
    """"model", "line" or "guess" (the `adapt` record's basis)."""

    def predict_global(self, total: int) -> float:
        """The predicted round (ms) at a global batch of `total`; endless (math.inf) where it cannot be
        made up (PolicyRounds)."""


@dataclass(frozen=True)
class FittedRounds:
    """The model policy's estimator: each worker's fitted finish time and the round's overhead c;
    `lower`/`upper` bound each worker's batch for `predict_global`."""

    times: Mapping[str, FinishTime]
    overhead_ms: float = 0.0
    lower: Mapping[str, int] = field(default_factory=dict)
    upper: Mapping[str, int] = field(default_factory=dict)
    table: FinishTable | None = field(default=None, compare=False)
    """`times` as a FinishTable where the caller has one (rows in the order of their keys)."""
    basis: ClassVar[str] = "model"

    def predict(self, plan: Mapping[str, int]) -> float:
        """The round of `plan`: its slowest finish plus c."""
        return round_time(self.times, plan, self.table) + self.overhead_ms

    def predict_global(self, total: int) -> float | None:
        """The round at the best split of `total` over the workers of `times`; None outside their bounds."""
        plan = self.plan_global(total)
        return None if plan is None else self.predict(plan)

    def plan_global(self, total: int) -> dict[str, int] | None:
        """The best split of `total` over the workers of `times`; None outside their bounds."""
        keys = list(self.times)
        if not sum(self.lower[k] for k in keys) <= total <= sum(self.upper[k] for k in keys):
            return None
        return split(self.times, total, self.lower, self.upper)


@dataclass(frozen=True)
class LineRounds:
    """T(B) = fixed + slope·B, fitted through rounds measured at two or more global batches."""

    fixed: float
    slope: float
    basis: ClassVar[str] = "line"

    def predict_global(self, total: int) -> float:
        return self.fixed + self.slope * total


@dataclass(frozen=True)
class ScaledRounds:
    """The round measured at `current`: its balanced compute scaled with B, the rest kept."""

    current: int
    compute_ms: float
    overhead_ms: float
    basis: ClassVar[str] = "guess"

    def predict_global(self, total: int) -> float:
        return self.compute_ms * total / self.current + self.overhead_ms


@dataclass(frozen=True)
class PolicyRounds:
    """A batch policy's own prediction (its `predicted_round_ms`, a FittedRounds for the model
    policy); a B it cannot make up predicts an endless round."""

    predicted: Callable[[int], float | None]
    basis: ClassVar[str] = "model"

    def predict_global(self, total: int) -> float:
        return self.predicted(total) or math.inf


def measured_round(current: int, compute_ms: Mapping[str, float | None], round_ms: float | None) -> ScaledRounds | None:
    """T(B) from measurements at the current batch, for a policy without a fitted model: the balanced
    compute (the slowest measured worker's smoothed time; one whose batch just changed has none yet)
    scales with B, and what the round adds beyond it (server step, wire, waits) stays. None while no
    worker or the round is unmeasured."""
    times = [t for t in compute_ms.values() if t is not None]
    if round_ms is None or not times:
        return None
    compute = max(times)
    return ScaledRounds(current, compute, max(0.0, round_ms - compute))


def round_line(rounds: Mapping[int, float]) -> LineRounds | None:
    """T(B) = a + c·B, the least-squares line through the median round times measured at two or more
    global batches (a ≥ 0, c > 0: a round costs at least its fixed part and grows with B); None with
    fewer, or where the points give no such line. It replaces `measured_round`'s guess that the
    workers' time is all per-sample once the job has run at a second B."""
    if len(rounds) < 2:
        return None
    xs, ys = list(rounds), [rounds[b] for b in rounds]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / spread
    if not slope > 0:
        return None
    return LineRounds(max(0.0, my - slope * mx), slope)


def global_round_model(predicted: Callable[[int], float | None], current: int, rounds: Mapping[int, float],
                       compute_ms: Mapping[str, float | None], round_ms: float | None) -> tuple[RoundModel | None, str]:
    """The estimator of T(B) for --adaptive-batch at the current B, and its basis: the policy's
    fitted model where it has one (`predicted`, "model"), else the line through the rounds measured
    at two or more B ("line"), else the times measured at B now scaled with B ("guess"; None while
    those are unmeasured)."""
    if predicted(current) is not None:
        return PolicyRounds(predicted), "model"
    line = round_line(rounds)
    if line is not None:
        return line, "line"
    return measured_round(current, compute_ms, round_ms), "guess"

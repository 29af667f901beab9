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

FinishTime = Callable[[int], float]
"""A worker's predicted finish time (ms) at a batch; nondecreasing."""

_BISECTIONS = 64


def split(times: Mapping[str, FinishTime], total: int, lower: Mapping[str, int],
          upper: Mapping[str, int]) -> dict[str, int]:
    """Integers within [lower, upper] summing to `total` that minimise max_i times[i](b_i): the best
    split of B (Cannikin's OptPerf). For compute-bound workers the optimum finishes them together
    (Cannikin Appendix A.1): in the continuous limit b_i = (μ − s_i)/q_i with μ = (B + Σ s_i/q_i) /
    Σ 1/q_i. Here it is solved on integers for any nondecreasing f_i: each unit of B goes to the worker
    that would finish it soonest (exact for min-max with nondecreasing costs), after a search on T
    has placed all but about one unit a worker at once; bounds are water levels the fill cannot cross.

    Requires sum(lower) <= total <= sum(upper) (ValueError otherwise). Ties go to the first key.
    """
    keys = list(times)
    if sum(lower[k] for k in keys) > total or sum(upper[k] for k in keys) < total:
        raise ValueError(f"infeasible split of {total}: bounds sum to [{sum(lower[k] for k in keys)}, "
                         f"{sum(upper[k] for k in keys)}]")
    plan = {k: lower[k] for k in keys}
    left = total - sum(plan.values())
    if left == 0 or not keys:
        return plan
    # place most units at once: a level T whose caps fit in `total` with at most one unit a worker
    # left over. The caps' sum is nearly linear in T, so T is found by false position (Illinois: an
    # end kept twice has its residual halved; every fourth step bisects), and each worker's cap is
    # searched between its caps at the two ends only (caps grow with T)
    low, high = min(times[k](lower[k]) for k in keys), max(times[k](upper[k]) for k in keys)
    best, ceiling = dict(plan), dict(upper)
    aim = total - len(keys) / 2
    below, above = sum(best.values()) - aim, sum(ceiling.values()) - aim
    kept = 0  # +1: the low end moved last, -1: the high end
    for step in range(_BISECTIONS):
        if total - sum(best.values()) <= len(keys) or high - low <= 1e-9 * max(1.0, abs(high)):
            break
        level = low - below * (high - low) / (above - below) if step % 4 != 3 and above > below else (low + high) / 2
        if not low < level < high:
            level = (low + high) / 2
        caps = {k: best[k] if best[k] == ceiling[k] else batch_within(times[k], level, best[k], ceiling[k])
                for k in keys}
        if sum(caps.values()) <= total:
            best, low, below = caps, level, sum(caps.values()) - aim
            above, kept = (above / 2 if kept == 1 else above), 1
        else:
            ceiling, high, above = caps, level, sum(caps.values()) - aim
            below, kept = (below / 2 if kept == -1 else below), -1
    plan = best
    left = total - sum(plan.values())
    # the rest one unit at a time, each to the worker that finishes it soonest: the units of least
    # finish in order, from any level's caps the same plan
    heap = [(times[k](plan[k] + 1), i, k) for i, k in enumerate(keys) if plan[k] < upper[k]]
    heapq.heapify(heap)
    while left > 0:
        _, i, k = heapq.heappop(heap)
        plan[k] += 1
        left -= 1
        if plan[k] < upper[k]:
            heapq.heappush(heap, (times[k](plan[k] + 1), i, k))
    return plan


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


def round_time(times: Mapping[str, FinishTime], plan: Mapping[str, int]) -> float:
    """The slowest finish among the workers with a batch (0 when none has one)."""
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
    basis: ClassVar[str] = "model"

    def predict(self, plan: Mapping[str, int]) -> float:
        """The round of `plan`: its slowest finish plus c."""
        return round_time(self.times, plan) + self.overhead_ms

    def predict_global(self, total: int) -> float | None:
        """The round at the best split of `total` over the workers of `times`; None outside their bounds."""
        keys = list(self.times)
        if not sum(self.lower[k] for k in keys) <= total <= sum(self.upper[k] for k in keys):
            return None
        return self.predict(split(self.times, total, self.lower, self.upper))


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

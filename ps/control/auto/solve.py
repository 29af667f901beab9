"""The split the laws ask for: the best split of B (model/optperf.py), parking a worker only where it
surely only slows the round, that is where even the most favourable reading of its law finishes its
minimum batch after the others' round. A fixed cost extrapolated from nearby batch sizes is too
uncertain to park a worker on; a proportional line counts no fixed cost, so below the batch it was
measured at it is such a reading already. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ps.control.model.optperf import best_plan
from ps.control.model.time_fit import CAUTION, Finish
from ps.control.performance import FinishTable, FinishTime, round_time

MIN_GAIN = 0.03
"""Parking must shorten the predicted round by this much (of the round with it parked)."""


def solve(times: Mapping[str, FinishTime], finishes: Mapping[str, Finish], total: int, lower: Mapping[str, int],
          upper: Mapping[str, int], *, may_park: Iterable[str], overhead: float,
          prefer: Iterable[str], table: FinishTable | None = None) -> tuple[dict[str, int], list[str], dict[str, float]]:
    """The best split of `total` by `times` within the bounds, parking those of `may_park` that pay
    for it and `surely_slower` says so (those parked now, `prefer`, favoured in a near-tie); the plan,
    the parked workers and the rounds compared (optperf.best_plan's). `table`: `times` as a
    FinishTable where the caller has one."""
    candidates = list(may_park)
    for _ in range(2):
        plan, parked, compared = best_plan(times, total, lower, upper, may_park=candidates, overhead=overhead,
                                           min_gain=MIN_GAIN, prefer=prefer, table=table)
        level = round_time(times, plan, table) * (1.0 + MIN_GAIN)
        sure = [k for k in parked if k in finishes and surely_slower(finishes[k], lower[k], level)]
        if sure == parked:
            break
        candidates = sure
    return plan, parked, compared


def surely_slower(finish: Finish, batch: int, level: float) -> bool:
    """Whether the finish time at `batch`, CAUTION standard errors of its law below it, is after `level`."""
    return finish.at(batch) - CAUTION * finish.line.sd(batch) > level

"""ps.control.model.finish_table: the fitted finish times of many workers (a Finish's calls, and
Priced times over them) as arrays price every batch as their calls do, bit for bit, and a solve over them plans, and a plan's round over them prices, what
one over the calls does (pure)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ps.control.model.finish_table import MIN_ROWS, Priced, offset_by, table_of
from ps.control.model.optperf import best_plan
from ps.control.model.time_fit import Finish, Line
from ps.control.performance import FinishTime, FittedRounds, batch_within, round_time, split

FAST = settings(max_examples=40, deadline=None)


def finishes(seed: int, n: int) -> dict[str, FinishTime]:
    """`n` fitted finish times of lognormal speeds: some cautious, some with exposed communication, some
Priced, some later by an offset."""
    rng = random.Random(seed)
    times: dict[str, FinishTime] = {}
    for i in range(n):
        q, s = 0.5 * rng.lognormvariate(0.0, 0.5), rng.uniform(0.0, 20.0)
        var_q = rng.choice([0.0, rng.uniform(1e-6, 1e-3)])
        line = Line(q, s, var_s=rng.uniform(0.0, 2.0), cov=-rng.uniform(0.0, 0.02) if var_q else 0.0, var_q=var_q)
        exposed = Line(-rng.uniform(0.0, q), rng.uniform(0.0, 30.0)) if rng.random() < 0.3 else None
        finish = Finish(line, exposed, rng.uniform(0.0, 5.0) if exposed else 0.0)
        times[f"w{i}"] = finish.cautious if rng.random() < 0.6 else finish.at
        if rng.random() < 0.3:  # priced by a policy: slowed by a factor up to a cap, held below a batch
            priced = Priced(finish, cautious=rng.random() < 0.5, factor=rng.choice([1.0, rng.uniform(1.5, 8.0)]),
                            cap=rng.choice([math.inf, rng.uniform(0.5, 5.0)]))
            times[f"w{i}"] = priced.steeper_below(rng.randint(1, 400), rng.choice([None, rng.uniform(0.0, 1.0)])) \
                if rng.random() < 0.7 else priced
        if rng.random() < 0.3:  # its push's slot in the server's queue (auto/arrival.py)
            times[f"w{i}"] = offset_by(times[f"w{i}"], rng.uniform(0.0, 40.0))
    return times


@FAST
@given(st.integers(0, 10_000), st.integers(MIN_ROWS, 300))
def test_the_table_prices_and_caps_every_worker_as_its_call_does(seed: int, n: int) -> None:
    times = finishes(seed, n)
    table = table_of(times)
    assert table is not None
    rng = np.random.default_rng(seed)
    lo = rng.integers(0, 50, n)
    hi = lo + rng.integers(0, 5000, n)
    calls = list(times.values())
    assert table.at(hi).tolist() == [t(b) for t, b in zip(calls, hi.tolist())]
    for level in (0.0, 5.0, 50.0, 400.0, 3000.0):
        assert table.within(level, lo, hi).tolist() == [
            batch_within(t, level, a, b) for t, a, b in zip(calls, lo.tolist(), hi.tolist())]
    rows = rng.permutation(n)[: n // 2]
    assert table.at(hi[rows], rows).tolist() == [calls[r](hi[r]) for r in rows.tolist()]


@FAST
@given(st.integers(0, 10_000), st.integers(MIN_ROWS, 200), st.integers(2, 100))
def test_a_solve_over_the_table_plans_what_one_over_the_calls_plans(seed: int, n: int, per_worker: int) -> None:
    times = finishes(seed, n)
    calls = {k: (lambda b, t=t: t(b)) for k, t in times.items()}  # not a Finish's method: no table
    assert table_of(calls) is None
    total = per_worker * n
    lower, upper = dict.fromkeys(times, 1), dict.fromkeys(times, total)
    assert split(times, total, lower, upper, table_of(times)) == split(calls, total, lower, upper)
    keys = list(times)
    assert (best_plan(times, total, lower, upper, may_park=keys, overhead=1.0, min_gain=0.03, prefer=keys[:3])
            == best_plan(calls, total, lower, upper, may_park=keys, overhead=1.0, min_gain=0.03, prefer=keys[:3]))


@FAST
@given(st.integers(0, 10_000), st.integers(MIN_ROWS, 200), st.integers(1, 2_000))
def test_a_split_placed_in_bulk_over_the_table_is_the_one_over_the_calls(seed: int, n: int, per_worker: int) -> None:
    """Flat laws (no per-sample cost) among them: the search on T stops at their plateau and `fill`
    places the rest through the table's `take` and `within`."""
    rng = random.Random(seed)
    times = {f"w{i}": Finish(Line(0.0 if rng.random() < 0.4 else rng.lognormvariate(0.0, 0.5),
                                  rng.choice([5.0, 10.0, rng.uniform(0.0, 20.0)])), None, 0.0).at for i in range(n)}
    calls = {k: (lambda b, t=t: t(b)) for k, t in times.items()}
    total = per_worker * n
    lower, upper = dict.fromkeys(times, 1), dict.fromkeys(times, total)
    assert split(times, total, lower, upper, table_of(times)) == split(calls, total, lower, upper)


@FAST
@given(st.integers(0, 10_000), st.integers(MIN_ROWS, 200))
def test_a_plans_round_over_the_table_is_the_slowest_call(seed: int, n: int) -> None:
    times = finishes(seed, n)
    table = table_of(times)
    rng = random.Random(seed)
    plan = {k: rng.choice([0, rng.randint(1, 500)]) for k in reversed(list(times))}  # parked ones, any order
    assert round_time(times, plan, table) == round_time(times, plan)
    assert FittedRounds(times, 2.0, table=table).predict(plan) == FittedRounds(times, 2.0).predict(plan)
    assert round_time(times, dict.fromkeys(times, 0), table) == 0.0
    with pytest.raises(KeyError):  # a planned worker without a time, as without the table
        round_time(times, {**plan, "stranger": 3}, table)


def test_fewer_workers_or_other_times_have_no_table() -> None:
    assert table_of(finishes(0, MIN_ROWS - 1)) is None
    assert table_of({**finishes(0, MIN_ROWS), "x": lambda b: 1.0 * b}) is None


def test_an_offset_time_is_the_time_later_by_the_offset_and_still_a_row() -> None:
    finish = Finish(Line(0.5, 3.0, var_s=1.0, var_q=1e-4))
    for time in (finish.at, finish.cautious, Priced(finish, factor=2.0, cap=0.8).steeper_below(40)):
        later = offset_by(time, 7.5)
        assert offset_by(time, 0.0) is time
        assert [later(b) for b in (1, 20, 40, 300)] == [time(b) + 7.5 for b in (1, 20, 40, 300)]
        assert isinstance(later, Priced)
    assert offset_by(offset_by(finish.at, 2.0), 3.0) == offset_by(finish.at, 5.0)

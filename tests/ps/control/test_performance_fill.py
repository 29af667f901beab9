"""ps.control.performance's split places what its search on T leaves over in bulk (`fill`), and its
plans are those of the heap that placed them one unit at a time, kept here as the oracle (a flat or
quantised finish time's plateau left all of B to it: 4e8 units, minutes a decision)."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ps.control.performance import CallTable, FinishTime, fill, split

FAST = settings(max_examples=150, deadline=None)


def heap_split(times: dict[str, FinishTime], total: int, lower: dict[str, int],
               upper: dict[str, int]) -> dict[str, int]:
    """split's plan before `fill` (the oracle): its heap from the lower bounds. The old split ran the
    heap from the caps its search on T had reached, which are every unit finishing by a level, the
    least units of the heap's order however far it got: the same plan."""
    keys = list(times)
    plan = unit_by_unit(list(times.values()), [lower[k] for k in keys], [upper[k] for k in keys],
                        total - sum(lower.values()))
    return dict(zip(keys, plan))


def unit_by_unit(funcs: list[FinishTime], plan: list[int], bound: list[int], left: int) -> list[int]:
    """`left` units handed out one at a time from `plan`, each to the worker that finishes it soonest
    (ties to the first): with nondecreasing finish times, the `left` least units by (finish, worker),
    as the old heap popped them."""
    units = sorted((funcs[i](b), i, b) for i in range(len(plan))
                   for b in range(plan[i] + 1, min(bound[i], plan[i] + left) + 1))
    plan = list(plan)
    for _, i, _ in units[:left]:
        plan[i] += 1
    return plan


class Law:
    """A nondecreasing finish time: q·b + s, quantised to `grain` ms (0: not), plus `step` from
    batch `jump` on; q = 0 is flat, and a tiny q beside a large s is flat in floats."""

    calls = 0

    def __init__(self, q: float, s: float, grain: float, jump: int, step: float) -> None:
        self.q, self.s, self.grain, self.jump, self.step = q, s, grain, jump, step

    def __call__(self, b: int) -> float:
        Law.calls += 1
        t = self.q * b + self.s
        if self.grain:
            t = (t // self.grain) * self.grain
        return t + (self.step if self.jump and b >= self.jump else 0.0)


laws = st.builds(
    Law,
    q=st.sampled_from([0.0, 1e-12, 0.25, 1.0, 3.0]) | st.floats(0.0, 5.0),
    s=st.sampled_from([0.0, 5.0, 1e6]) | st.floats(0.0, 80.0),
    grain=st.sampled_from([0.0, 0.0, 1.0, 10.0]),
    jump=st.sampled_from([0, 0, 7, 40]),
    step=st.sampled_from([0.0, 2.5, 30.0]),
)


@st.composite
def problems(draw: st.DrawFn) -> tuple[dict[str, FinishTime], int, dict[str, int], dict[str, int]]:
    """Finish times, a B and bounds: some workers parked (bounds 0, 0), some pinned, some free."""
    n = draw(st.integers(1, 8))
    times: dict[str, FinishTime] = {f"w{i}": draw(laws) for i in range(n)}
    lower, upper = {}, {}
    for k in times:
        kind = draw(st.sampled_from(["parked", "pinned", "free", "free", "wide"]))
        lower[k] = 0 if kind == "parked" else draw(st.integers(0, 4))
        upper[k] = {"parked": 0, "pinned": lower[k], "free": lower[k] + draw(st.integers(0, 300)),
                    "wide": lower[k] + 5000}[kind]
    low, high = sum(lower.values()), sum(upper.values())
    total = draw(st.integers(low, min(high, low + 6000)))
    return times, total, lower, upper


@FAST
@given(problems())
def test_split_plans_what_the_one_unit_at_a_time_fill_planned(problem: tuple) -> None:
    times, total, lower, upper = problem
    assert split(times, total, lower, upper) == heap_split(times, total, lower, upper)


@FAST
@given(problems(), st.data())
def test_fill_places_the_units_a_heap_places_one_at_a_time(problem: tuple, data: st.DataObject) -> None:
    times, _, lower, upper = problem
    lo = np.array(list(lower.values()), dtype=np.int64)
    hi = np.array(list(upper.values()), dtype=np.int64)
    room = int((hi - lo).sum())
    left = data.draw(st.integers(min(1, room), room))
    funcs = list(times.values())
    placed = fill(CallTable(funcs), lo, hi, left).tolist()
    assert placed == unit_by_unit(funcs, lo.tolist(), hi.tolist(), left)


def test_a_global_batch_of_4e8_over_hundreds_of_workers_with_flat_laws_prices_each_a_few_hundred_times() -> None:
    """Every other worker flat: the search on T stops at the plateau with all of B left over, which
    the heap placed in 4e8 steps."""
    rnd = random.Random(3)
    n, total = 300, 400_000_000
    times: dict[str, FinishTime] = {
        f"w{i}": Law(0.0 if i % 2 else rnd.lognormvariate(0.0, 0.5), 50.0 if i % 2 else 10.0, 0.0, 0, 0.0)
        for i in range(n)}
    lower, upper = dict.fromkeys(times, 1), dict.fromkeys(times, total)
    Law.calls = 0
    plan = split(times, total, lower, upper)
    assert sum(plan.values()) == total
    assert Law.calls <= 500 * n

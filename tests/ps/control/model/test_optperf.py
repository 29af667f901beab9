"""ps.control.model.optperf.nearest_plan: among the splits about as fast as the optimum, the one nearest
the plan in force (pure)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from ps.control.model.optperf import nearest_plan
from ps.control.performance import round_time, split

FAST = settings(max_examples=60, deadline=None)


def lines(costs: dict[str, tuple[float, float]]) -> dict:
    return {k: (lambda b, q=q, s=s: q * b + s) for k, (q, s) in costs.items()}


def test_a_flat_optimum_keeps_the_plan_in_force() -> None:
    # per-sample cost tiny against the fixed cost: the optimum splits anyhow, the plan in force is as fast
    times = lines({"a": (0.001, 12.0), "b": (0.0012, 12.5), "c": (0.001, 12.2)})
    lower, upper = dict.fromkeys(times, 1), dict.fromkeys(times, 256)
    optimum = split(times, 256, lower, upper)
    current = {"a": 80, "b": 90, "c": 86}
    kept = nearest_plan(times, optimum, current, lower, upper, slack=0.015)
    assert kept == current
    assert round_time(times, kept) <= round_time(times, optimum) * 1.015


def test_a_worker_that_must_move_moves_and_the_others_keep_their_shares() -> None:
    times = lines({"a": (1.0, 5.0), "b": (1.0, 5.0), "c": (4.0, 5.0)})  # c got four times slower
    lower, upper = dict.fromkeys(times, 1), dict.fromkeys(times, 300)
    current = {"a": 100, "b": 100, "c": 100}
    optimum = split(times, 300, lower, upper)
    kept = nearest_plan(times, optimum, current, lower, upper, slack=0.01)
    assert kept["c"] <= optimum["c"] + 1 and abs(kept["a"] - kept["b"]) <= 1
    assert round_time(times, kept) <= round_time(times, optimum) * 1.01


def test_parked_workers_stay_parked_and_a_newcomer_gets_its_optimal_batch() -> None:
    times = lines({"a": (0.1, 10.0), "b": (0.1, 10.0), "slow": (0.4, 60.0)})
    lower, upper = dict.fromkeys(times, 1), dict.fromkeys(times, 256)
    plan = {"a": 120, "b": 120, "slow": 16}  # a re-probe: slow is brought back at 16
    kept = nearest_plan(times, plan, {"a": 128, "b": 128, "slow": 0}, lower, upper, slack=0.015)
    assert kept["slow"] == 16 and sum(kept.values()) == 256
    parked = nearest_plan(times, {"a": 128, "b": 128, "slow": 0}, {"a": 100, "b": 100, "slow": 56},
                          lower, upper, slack=0.015)
    assert parked["slow"] == 0 and sum(parked.values()) == 256


@FAST
@given(st.integers(2, 6), st.integers(8, 2000), st.floats(0.0, 0.2), st.integers(0, 10**6))
def test_the_sum_the_bounds_and_the_round_hold(n: int, total: int, slack: float, seed: int) -> None:
    rnd = random.Random(seed)
    keys = [f"w{i}" for i in range(n)]
    times = lines({k: (rnd.uniform(0.0, 2.0), rnd.uniform(0.0, 50.0)) for k in keys})
    lower = {k: rnd.randint(1, max(1, total // (2 * n))) for k in keys}
    upper = {k: lower[k] + rnd.randint(total // n, total) for k in keys}
    if sum(upper.values()) < total:
        return
    optimum = split(times, total, lower, upper)
    current = {k: rnd.randint(0, total) for k in keys}
    kept = nearest_plan(times, optimum, current, lower, upper, slack)
    assert sum(kept.values()) == total
    assert all(lower[k] <= kept[k] <= upper[k] for k in keys)
    assert round_time(times, kept) <= round_time(times, optimum) * (1 + slack) + 1e-9

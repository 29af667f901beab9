"""ps.control.model.optperf: the best plan with parking, and among the splits about as fast as the optimum
the one nearest the plan in force (pure)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ps.control.model.optperf import best_plan, nearest_plan
from ps.control.performance import FittedRounds, round_time, split

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


def test_a_worker_measured_early_that_the_laws_too_finish_early_takes_its_solved_batch() -> None:
    # w1 idles: its fixed cost dominates, and at 49 samples it finishes 14% before the round
    times = lines({"w0": (6.3, 200.0), "w1": (5.5, 233.0), "w2": (1.5, 25.0), "w3": (10.7, 212.0)})
    lower, upper = dict.fromkeys(times, 1), dict.fromkeys(times, 512)
    current = {"w0": 58, "w1": 49, "w2": 372, "w3": 33}
    optimum = split(times, 512, lower, upper)
    assert nearest_plan(times, optimum, current, lower, upper, slack=0.015)["w1"] < optimum["w1"] - 5
    for raised in (nearest_plan(times, optimum, current, lower, upper, slack=0.015, idle=["w1"], band=0.1),
                   nearest_plan(times, optimum, current, lower, upper, slack=0.015, idle=["w1", "w0"], band=0.1)):
        assert raised["w1"] >= optimum["w1"] - 1 and raised["w0"] in (57, 58) and sum(raised.values()) == 512
    # measured early, but the laws put it within the deadband of the round: kept
    assert nearest_plan(times, optimum, {**current, "w1": 56, "w2": 365}, lower, upper, slack=0.015, idle=["w1"],
                        band=0.1)["w1"] < optimum["w1"]


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


# ---------------------------------------------------------------- best_plan at many workers


class Counted:
    """A line q·b + s that counts its calls."""

    calls = 0

    def __init__(self, q: float, s: float) -> None:
        self.q, self.s = q, s

    def __call__(self, b: int) -> float:
        Counted.calls += 1
        return self.q * b + self.s


def every_prefix(times: dict, total: int, lower: dict, upper: dict, may_park: list[str], overhead: float,
                 min_gain: float, prefer: list[str]) -> tuple[dict, list, dict]:
    """best_plan's rule as its docstring states it, every prefix of the candidates solved (the oracle)."""
    model = FittedRounds(times, overhead)
    plan = split(times, total, lower, upper)
    held = model.predict(plan)
    order = sorted((k for k in dict.fromkeys(may_park) if k in times),
                   key=lambda k: times[k](lower[k]) * (1.0 + min_gain if k in set(prefer) else 1.0), reverse=True)
    trial = None
    for n in range(1, len(order) + 1):
        rest = [j for j in times if j not in set(order[:n])]
        if not rest:
            break
        if not sum(lower[j] for j in rest) <= total <= sum(upper[j] for j in rest):
            continue
        p = split({j: times[j] for j in rest}, total, lower, upper)
        t = model.predict(p)
        if trial is None or t < trial[0]:
            trial = (t, order[:n], p)
    if trial is None:
        return plan, [], {}
    running = [k for k in times if upper[k] > 0]  # a worker held at 0 by its bounds is in no round
    if max(times[k](lower[k]) for k in running) + overhead < held:  # every minimum within the round: no gain
        assert trial[0] >= held, "a parked prefix beat the round although every worker makes its minimum"
        return plan, [], {}
    compared = {"held": held, "parked": trial[0]}
    if not trial[0] * (1.0 + min_gain) < held:
        return plan, [], compared
    return {**dict.fromkeys(times, 0), **trial[2]}, trial[1], compared


@pytest.mark.parametrize("seed", range(60))
def test_best_plan_is_the_best_of_every_prefix(seed: int) -> None:
    rnd = random.Random(seed)
    n = rnd.randint(1, 12)
    keys = [f"w{i}" for i in range(n)]
    # fixed costs from none to several rounds' worth, some equal (ties), a few very slow workers
    times = lines({k: (rnd.choice([0.5, rnd.lognormvariate(0, 1)]), rnd.choice([0.0, 10.0, rnd.uniform(0, 300)]))
                   for k in keys})
    lower = {k: rnd.choice([1, 1, rnd.randint(1, 8)]) for k in keys}
    upper = {k: lower[k] + rnd.choice([rnd.randint(0, 40), 1000]) for k in keys}
    total = rnd.randint(sum(lower.values()), min(sum(upper.values()), 60 * n))
    may_park = rnd.sample(keys, rnd.randint(0, n))
    prefer = rnd.sample(may_park, rnd.randint(0, len(may_park)))
    overhead, min_gain = rnd.choice([0.0, 3.0]), rnd.choice([0.0, 0.03, 0.2])
    got = best_plan(times, total, lower, upper, may_park=may_park, overhead=overhead, min_gain=min_gain, prefer=prefer)
    assert got == every_prefix(times, total, lower, upper, may_park, overhead, min_gain, prefer)


@pytest.mark.parametrize("seed", range(40))
def test_a_worker_held_at_0_by_its_bounds_sets_no_floor_to_the_round(seed: int) -> None:
    """Workers its caller keeps out (bounds [0, 0], not candidates) take no part in any round: the
    best plan parks the slow candidates as if they were not there. Their time at batch 0 counted as
    the slowest minimum of every prefix's rest once, and a split of 64 workers then parked one slow
    worker of 37 (a round of 208 ms where parking them all made 22)."""
    rnd = random.Random(seed)
    n = rnd.randint(2, 10)
    keys = [f"w{i}" for i in range(n)]
    times = lines({k: (rnd.lognormvariate(0, 1), rnd.choice([0.0, 10.0, rnd.uniform(0, 300)])) for k in keys})
    out = {f"x{i}": rnd.uniform(50.0, 900.0) for i in range(rnd.randint(1, 3))}  # kept out: a fixed cost alone
    times.update(lines({k: (1.0, s) for k, s in out.items()}))
    lower = {**{k: rnd.choice([1, rnd.randint(1, 8)]) for k in keys}, **dict.fromkeys(out, 0)}
    upper = {**{k: lower[k] + rnd.choice([rnd.randint(0, 40), 1000]) for k in keys}, **dict.fromkeys(out, 0)}
    total = rnd.randint(sum(lower.values()), min(sum(upper.values()), 60 * n))
    may_park = rnd.sample(keys, rnd.randint(1, n))
    got = best_plan(times, total, lower, upper, may_park=may_park, min_gain=0.03)
    assert got == every_prefix(times, total, lower, upper, may_park, 0.0, 0.03, [])
    assert all(got[0][k] == 0 for k in out)


def test_a_kept_out_worker_does_not_stop_the_slow_ones_being_parked() -> None:
    times = lines({"fast": (0.1, 2.0), "fast2": (0.1, 2.0), "slow": (1.0, 200.0), "slow2": (1.0, 190.0),
                   "out": (250.0, 0.0)})
    lower = {"fast": 1, "fast2": 1, "slow": 1, "slow2": 1, "out": 0}
    upper = {"fast": 256, "fast2": 256, "slow": 256, "slow2": 256, "out": 0}
    plan, parked, _ = best_plan(times, 256, lower, upper, may_park=["fast", "fast2", "slow", "slow2"], min_gain=0.03)
    assert sorted(parked) == ["slow", "slow2"] and plan["fast"] + plan["fast2"] == 256


def test_best_plan_prices_a_few_prefixes_not_every_one() -> None:
    """300 workers any of which may be parked: a split for every prefix called each finish time ~95,000
    times (28 s; minutes at thousands of workers, on every full solve of the model policy)."""
    rnd = random.Random(1)
    times = {f"w{i}": Counted(rnd.lognormvariate(0.0, 0.5), rnd.uniform(1.0, 60.0)) for i in range(300)}
    slow = {f"s{i}": Counted(rnd.lognormvariate(0.0, 0.5), 900.0) for i in range(20)}  # outlast any round
    times.update(slow)
    lower, upper = dict.fromkeys(times, 1), dict.fromkeys(times, 64 * 320)
    Counted.calls = 0
    plan, parked, _ = best_plan(times, 64 * 320, lower, upper, may_park=list(times))
    assert sorted(parked) == sorted(slow) and sum(plan.values()) == 64 * 320
    assert Counted.calls <= 200 * len(times)

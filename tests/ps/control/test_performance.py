"""ps.control.performance, the one model of a round's time: a plan's round and a global batch's from
the fitted finish times and c, the line through rounds measured at several B, the guess from one B,
and which of them --adaptive-batch takes."""

from __future__ import annotations

import random

import pytest

from ps.control.performance import (FittedRounds, batch_within, global_round_model, measured_round, round_line,
                                    split)


def line(q: float, s: float):  # noqa: ANN201 - a finish time
    return lambda b: q * b + s


def test_a_plans_round_is_its_slowest_finish_plus_c_and_a_parked_worker_counts_nothing() -> None:
    model = FittedRounds({"a": line(1.0, 2.0), "b": line(2.0, 0.0)}, overhead_ms=5.0)
    assert model.predict({"a": 10, "b": 4}) == pytest.approx(17.0)
    assert model.predict({"a": 10, "b": 0}) == pytest.approx(17.0)
    assert model.predict({"a": 0, "b": 0}) == pytest.approx(5.0)


def test_a_global_batchs_round_is_that_of_its_best_split_within_the_bounds() -> None:
    times = {"a": line(1.0, 0.0), "b": line(3.0, 0.0)}
    model = FittedRounds(times, 1.0, lower={"a": 1, "b": 1}, upper={"a": 100, "b": 100})
    assert split(times, 40, model.lower, model.upper) == {"a": 30, "b": 10}
    assert model.predict_global(40) == pytest.approx(31.0)
    assert model.predict_global(1) is None and model.predict_global(201) is None


def test_adaptive_batch_takes_the_fit_then_the_line_then_the_guess() -> None:
    fitted, basis = global_round_model(lambda b: 2.0 * b, 64, {32: 10.0, 64: 20.0}, {"a": 5.0}, 8.0)
    assert basis == "model" and fitted is not None and fitted.predict_global(100) == pytest.approx(200.0)
    assert global_round_model(lambda b: None if b == 64 else 1.0, 64, {}, {}, None)[1] == "guess"
    fitted, basis = global_round_model(lambda b: None, 64, {32: 10.0, 64: 20.0}, {"a": 5.0}, 8.0)
    assert basis == "line" and fitted == round_line({32: 10.0, 64: 20.0})
    fitted, basis = global_round_model(lambda b: None, 64, {64: 20.0}, {"a": 6.0, "b": None}, 8.0)
    assert basis == "guess" and fitted == measured_round(64, {"a": 6.0}, 8.0)
    assert fitted is not None and fitted.predict_global(128) == pytest.approx(14.0)
    assert global_round_model(lambda b: None, 64, {}, {"a": None}, 8.0) == (None, "guess")


def test_a_policy_the_adaptive_batch_cannot_split_predicts_an_endless_round() -> None:
    fitted, _ = global_round_model(lambda b: 1.0 if b == 64 else None, 64, {}, {}, None)
    assert fitted is not None and fitted.predict_global(65) == float("inf")


# ---------------------------------------------------------------- split and batch_within at many workers


class Counted:
    """A finish time q·b + s (plus `step` ms from batch `jump` on: a communication-bound kink) that
    counts its calls."""

    calls = 0

    def __init__(self, q: float, s: float, jump: int = 0, step: float = 0.0) -> None:
        self.q, self.s, self.jump, self.step = q, s, jump, step

    def __call__(self, b: int) -> float:
        Counted.calls += 1
        return self.q * b + self.s + (self.step if self.jump and b >= self.jump else 0.0)


def unit_by_unit(times: dict, total: int, lower: dict[str, int], upper: dict[str, int]) -> dict[str, int]:
    """split's rule as its docstring states it: from the lower bounds, each unit to the worker that
    finishes it soonest, ties to the first key (the oracle)."""
    plan = dict(lower)
    for _ in range(total - sum(plan.values())):
        k = min((k for k in times if plan[k] < upper[k]), key=lambda k: times[k](plan[k] + 1))
        plan[k] += 1
    return plan


def problems(seed: int, n: int) -> tuple[dict, int, dict[str, int], dict[str, int]]:
    rnd = random.Random(seed)
    times = {f"w{i}": Counted(rnd.lognormvariate(0.0, 0.7), rnd.choice([0.0, 5.0, rnd.uniform(0, 80)]),
                              rnd.choice([0, rnd.randint(1, 40)]), rnd.choice([0.0, rnd.uniform(0, 30)]))
             for i in range(n)}
    lower = {k: rnd.randint(1, 4) for k in times}
    upper = {k: lower[k] + rnd.choice([0, rnd.randint(0, 60), 10_000]) for k in times}
    total = rnd.randint(sum(lower.values()), min(sum(upper.values()), 40 * n))
    return times, total, lower, upper


@pytest.mark.parametrize("seed", range(40))
def test_split_is_the_unit_by_unit_fill(seed: int) -> None:
    times, total, lower, upper = problems(seed, 1 + seed % 9)
    assert split(times, total, lower, upper) == unit_by_unit(times, total, lower, upper)


@pytest.mark.parametrize("seed", range(40))
def test_batch_within_is_the_largest_batch_within_the_level(seed: int) -> None:
    rnd = random.Random(seed)
    time = Counted(rnd.lognormvariate(0.0, 1.0), rnd.uniform(0, 50), rnd.randint(0, 300), rnd.uniform(0, 40))
    lo = rnd.randint(1, 50)
    hi = lo + rnd.randint(0, 400)
    for level in (rnd.uniform(time(lo) - 10, time(hi) + 10) for _ in range(30)):
        inside = [b for b in range(lo, hi + 1) if time(b) <= level]
        assert batch_within(time, level, lo, hi) == (inside[-1] if inside else lo)


def test_split_calls_each_finish_time_a_few_dozen_times_at_thousands_of_workers() -> None:
    """2,000 workers splitting 64 samples each: a bisection over T calling a binary search per worker
    at each of its levels called every finish time ~800 times (seconds a split; the model policy
    splits several times a decision)."""
    rnd = random.Random(1)
    times = {f"w{i}": Counted(rnd.lognormvariate(0.0, 0.5), 10.0) for i in range(2000)}
    lower, upper = dict.fromkeys(times, 1), dict.fromkeys(times, 64 * 2000)
    Counted.calls = 0
    plan = split(times, 64 * 2000, lower, upper)
    assert sum(plan.values()) == 64 * 2000
    assert Counted.calls <= 40 * len(times)

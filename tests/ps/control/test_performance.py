"""ps.control.performance, the one model of a round's time: a plan's round and a global batch's from
the fitted finish times and c, the line through rounds measured at several B, the guess from one B,
and which of them --adaptive-batch takes."""

from __future__ import annotations

import pytest

from ps.control.performance import FittedRounds, global_round_model, measured_round, round_line, split


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

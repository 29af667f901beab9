"""ps.control.split: largest-remainder rounding and the fit of real shares to an exact sum within
per-worker bounds (water-filling)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ps.control.split import fit_to_sum, largest_remainder, round_to_sum, water_fill
from tests.simulated_workers import water_level

FAST = settings(max_examples=40, deadline=None)


# ---------------------------------------------------------------- largest_remainder


def test_largest_remainder_examples() -> None:
    assert largest_remainder({"a": 1, "b": 1, "c": 1}, 10) == {"a": 4, "b": 3, "c": 3}
    assert largest_remainder({"a": 6, "b": 6, "c": 4, "d": 32}, 128) == {"a": 16, "b": 16, "c": 11, "d": 85}
    assert largest_remainder({"a": 0, "b": 2.5}, 7) == {"a": 0, "b": 7}
    assert largest_remainder({"a": 0, "b": 0}, 0) == {"a": 0, "b": 0}
    assert largest_remainder({}, 0) == {}


@pytest.mark.parametrize(
    ("weights", "total"),
    [
        ({"a": -1.0, "b": 2.0}, 3),
        ({"a": 0.0, "b": 0.0}, 3),
        ({}, 3),
        ({"a": 1.0}, -1),
        ({"a": math.nan}, 3),
        ({"a": math.inf}, 3),
        ({"a": 1.0}, 2.5),
        ({"a": True}, 3),
    ],
)
def test_largest_remainder_rejects(weights: dict[str, Any], total: Any) -> None:
    with pytest.raises(ValueError):
        largest_remainder(weights, total)


@FAST
@given(
    weights=st.lists(st.floats(0.0, 1e6, allow_nan=False), min_size=1, max_size=12).filter(lambda w: max(w) > 0),
    total=st.integers(0, 10_000),
)
def test_largest_remainder_exact_and_near(weights: list[float], total: int) -> None:
    w = {f"k{i}": v for i, v in enumerate(weights)}
    got = largest_remainder(w, total)
    assert sum(got.values()) == total
    mass = sum(weights)
    for k, v in w.items():
        assert abs(got[k] - v / mass * total) < 1.0 + 1e-9
        if v == 0:
            assert got[k] == 0


# ---------------------------------------------------------------- fit_to_sum


def test_fit_to_sum_proportional_when_no_bound_binds() -> None:
    assert fit_to_sum({"a": 1.0, "b": 3.0}, 8, {"a": 1, "b": 1}, {"a": 8, "b": 8}) == {"a": 2, "b": 6}


def test_fit_to_sum_redistributes_what_a_clip_frees() -> None:
    got = fit_to_sum({"a": 10.0, "b": 1.0, "c": 1.0}, 12, {"a": 1, "b": 1, "c": 1}, {"a": 6, "b": 12, "c": 12})
    assert got == {"a": 6, "b": 3, "c": 3}


def test_fit_to_sum_iterates_when_redistribution_hits_another_bound() -> None:
    targets = {"a": 10.0, "b": 5.0, "c": 1.0}
    got = fit_to_sum(targets, 20, {"a": 1, "b": 1, "c": 1}, {"a": 8, "b": 7, "c": 20})
    assert got == {"a": 8, "b": 7, "c": 5}


def test_fit_to_sum_lower_bound_takes_from_the_rest() -> None:
    assert fit_to_sum({"a": 100.0, "b": 1.0}, 20, {"a": 1, "b": 5}, {"a": 20, "b": 20}) == {"a": 15, "b": 5}


def test_fit_to_sum_empty() -> None:
    assert fit_to_sum({}, 0, {}, {}) == {}


@pytest.mark.parametrize(
    ("targets", "total", "lower", "upper", "message"),
    [
        ({"a": 1.0, "b": 1.0}, 3, {"a": 2, "b": 2}, {"a": 5, "b": 5}, "lower bounds sum"),
        ({"a": 1.0, "b": 1.0}, 11, {"a": 1, "b": 1}, {"a": 5, "b": 5}, "upper bounds sum"),
        ({"a": 1.0}, 3, {"a": 4}, {"a": 2}, "exceeds its upper bound"),
        ({"a": 1.0, "b": 1.0}, 4, {"a": 1}, {"a": 4, "b": 4}, "same worker ids"),
        ({"a": 0.0, "b": 1.0}, 4, {"a": 1, "b": 1}, {"a": 4, "b": 4}, "must be > 0"),
        ({"a": math.nan}, 4, {"a": 1}, {"a": 4}, "finite"),
        ({"a": 1.0}, 4, {"a": 1.5}, {"a": 4}, "integer"),
        ({}, 1, {}, {}, "upper bounds sum"),
    ],
)
def test_fit_to_sum_rejects(
    targets: dict[str, float], total: int, lower: dict[str, Any], upper: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        fit_to_sum(targets, total, lower, upper)


@st.composite
def fit_problems(draw: st.DrawFn) -> tuple[dict[str, float], int, dict[str, int], dict[str, int]]:
    """Feasible fit_to_sum inputs with bounds that often bind."""
    n = draw(st.integers(1, 10))
    keys = [f"k{i}" for i in range(n)]
    targets = {k: draw(st.floats(1e-3, 1e4)) for k in keys}
    lower = {k: draw(st.integers(0, 20)) for k in keys}
    upper = {k: lower[k] + draw(st.integers(0, 60)) for k in keys}
    total = draw(st.integers(sum(lower.values()), sum(upper.values())))
    return targets, total, lower, upper


@FAST
@given(fit_problems())
def test_fit_to_sum_properties(problem: tuple[dict[str, float], int, dict[str, int], dict[str, int]]) -> None:
    targets, total, lower, upper = problem
    got = fit_to_sum(targets, total, lower, upper)
    assert list(got) == list(targets)
    assert sum(got.values()) == total
    assert all(lower[k] <= got[k] <= upper[k] for k in got)
    ideal = water_level(targets, total, lower, upper)
    assert all(abs(got[k] - ideal[k]) < 1.0 + 1e-6 for k in got)




# ---------------------------------------------------------------- round_to_sum at many workers


def one_unit_at_a_time(exact: dict[str, float], total: int, lower: dict[str, int], upper: dict[str, int],
                       speeds: dict[str, float] | None) -> dict[str, int]:
    """round_to_sum's rule as its docstring states it, a unit at a time over every worker (the oracle)."""
    result = {k: min(upper[k], max(lower[k], math.floor(x))) for k, x in exact.items()}
    left = total - sum(result.values())
    while left > 0:
        room = [k for k in result if result[k] < upper[k]]
        if speeds is None:
            k = max(room, key=lambda k: exact[k] - result[k])
        else:
            k = min(room, key=lambda k: ((result[k] + 1) / speeds[k], -(exact[k] - result[k])))
        result[k] += 1
        left -= 1
    while left < 0:
        k = min((k for k in result if result[k] > lower[k]), key=lambda k: exact[k] - result[k])
        result[k] -= 1
        left += 1
    return result


@FAST
@given(fit_problems(), st.booleans())
def test_round_to_sum_hands_out_the_units_as_the_rule_says(
        problem: tuple[dict[str, float], int, dict[str, int], dict[str, int]], timed: bool) -> None:
    targets, total, lower, upper = problem
    exact, lo, hi = water_fill(targets, total, lower, upper)
    speeds = targets if timed else None
    assert round_to_sum(exact, total, lo, hi, speeds) == one_unit_at_a_time(exact, total, lo, hi, speeds)


def test_round_to_sum_ties_go_to_the_first_key() -> None:
    exact = {"a": 1.5, "b": 1.5, "c": 1.5, "d": 1.5}
    bounds = ({k: 0 for k in exact}, {k: 9 for k in exact})
    assert round_to_sum(exact, 6, *bounds) == {"a": 2, "b": 2, "c": 1, "d": 1}
    assert round_to_sum(exact, 6, *bounds, speeds={k: 1.0 for k in exact}) == {"a": 2, "b": 2, "c": 1, "d": 1}


class CountingBounds(dict):  # type: ignore[type-arg]
    """Upper bounds that count how often they are read."""

    reads = 0

    def __getitem__(self, key: str) -> int:
        CountingBounds.reads += 1
        return super().__getitem__(key)


@pytest.mark.parametrize("timed", [False, True])
def test_round_to_sum_reads_each_bound_a_few_times_not_once_per_unit(timed: bool) -> None:
    """Rounding 4,000 shares that each lose half a unit to the floor hands out 2,000 units; asking
    every worker's room for each of them read the bounds 8 million times (minutes at 10,000 workers)."""
    n = 4000
    exact = {f"w{i}": 10.5 for i in range(n)}
    upper = CountingBounds({k: 64 for k in exact})
    speeds = {k: 1.0 + (i % 7) for i, k in enumerate(exact)} if timed else None
    CountingBounds.reads = 0
    got = round_to_sum(exact, 21 * n // 2, {k: 1 for k in exact}, upper, speeds)
    assert sum(got.values()) == 21 * n // 2
    assert CountingBounds.reads <= 4 * n

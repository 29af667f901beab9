"""ps.control.proportional: the proportional law of the dynamic policy (OmniLearn Eq. 6 targets and
the Eq. 7 deadband)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ps.control.proportional import outside_deadband, proportional_targets

FAST = settings(max_examples=40, deadline=None)


# ---------------------------------------------------------------- Eq. 6 and Eq. 7


def test_proportional_targets_example() -> None:
    got = proportional_targets({"a": 32, "b": 32}, {"a": 1.0, "b": 3.0})
    assert got["a"] == pytest.approx(64.0)
    assert got["b"] == pytest.approx(64.0 / 3.0)


def test_proportional_targets_equal_times_keep_batches() -> None:
    got = proportional_targets({"a": 10, "b": 50, "c": 7}, {"a": 4.0, "b": 4.0, "c": 4.0})
    assert got == pytest.approx({"a": 10.0, "b": 50.0, "c": 7.0})


def test_proportional_targets_empty() -> None:
    assert proportional_targets({}, {}) == {}


@pytest.mark.parametrize(
    ("batches", "times"),
    [
        ({"a": 1}, {"a": 0.0}),
        ({"a": 1}, {"a": -1.0}),
        ({"a": 1}, {"a": math.inf}),
        ({"a": 0}, {"a": 1.0}),
        ({"a": 1}, {"b": 1.0}),
    ],
)
def test_proportional_targets_rejects(batches: dict[str, int], times: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        proportional_targets(batches, times)


@FAST
@given(
    st.lists(
        st.tuples(st.integers(1, 1000), st.floats(1e-2, 1e4)),
        min_size=1,
        max_size=8,
    )
)
def test_proportional_targets_is_eq_6b(rows: list[tuple[int, float]]) -> None:
    batches = {f"k{i}": b for i, (b, _) in enumerate(rows)}
    times = {f"k{i}": t for i, (_, t) in enumerate(rows)}
    mean = sum(times.values()) / len(times)
    got = proportional_targets(batches, times)
    for k, b in batches.items():
        throughput = b / times[k]
        assert got[k] == pytest.approx(b - throughput * (times[k] - mean), rel=1e-9, abs=1e-9)
        assert got[k] / throughput == pytest.approx(mean)


def test_outside_deadband() -> None:
    assert outside_deadband(100, 110.0, 0.09)
    assert not outside_deadband(100, 110.0, 0.1)
    assert outside_deadband(100, 125.0, 0.2)
    assert not outside_deadband(100, 95.0, 0.1)
    assert outside_deadband(100, 80.0, 0.25)
    assert outside_deadband(5, 5.0, 0.0)


@pytest.mark.parametrize(
    ("current", "target", "deadband"),
    [(1, 0.0, 0.1), (1, -2.0, 0.1), (1, 1.0, 1.0), (1, 1.0, -0.1), (1, math.nan, 0.1)],
)
def test_outside_deadband_rejects(current: int, target: float, deadband: float) -> None:
    with pytest.raises(ValueError):
        outside_deadband(current, target, deadband)



"""benchmarks.simulation.optimum: the exact best split for t = q·b + s, parking allowed, against brute
force on small cases."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from benchmarks.simulation import optimum
from benchmarks.simulation.optimum import best_split, round_ms


def brute_force(q: list[float], s: list[float], total: int, lo: int, hi: int, unit: int = 1) -> float:
    """The least round over every plan: each batch 0 or a whole number of units in [lo, hi]."""
    choices = [0, *range(-(-lo // unit) * unit, hi + 1, unit)]
    best = np.inf
    for plan in itertools.product(choices, repeat=len(q)):
        if sum(plan) == total:
            best = min(best, round_ms(np.array(q), np.array(s), np.array(plan)))
    return float(best)


def test_a_known_optimum() -> None:
    # two workers, the second twice as slow per sample: 20 and 10 samples finish together at 20 ms
    best = best_split(np.array([1.0, 2.0]), np.array([0.0, 0.0]), 30, 1, 30)
    assert best.batches.tolist() == [20, 10] and best.round_ms == 20.0 and best.parked == 0


def test_a_worker_whose_fixed_cost_outlasts_the_round_is_parked() -> None:
    best = best_split(np.array([1.0, 1.0, 1.0]), np.array([0.0, 0.0, 100.0]), 20, 1, 20)
    assert best.batches.tolist() == [10, 10, 0] and best.round_ms == 10.0 and best.parked == 1


@pytest.mark.parametrize("seed", range(30))
def test_the_optimum_is_brute_forces(seed: int) -> None:
    rnd = np.random.default_rng(seed)
    n = int(rnd.integers(1, 4))
    q = rnd.lognormal(0.0, 0.7, n).round(3).tolist()
    s = rnd.choice([0.0, 2.0, 30.0], n).tolist()
    total = int(rnd.integers(n, 13))
    hi = int(rnd.integers(-(-total // n), total + 1))
    best = best_split(np.array(q), np.array(s), total, 1, hi)
    assert int(best.batches.sum()) == total and all(b == 0 or 1 <= b <= hi for b in best.batches)
    assert best.round_ms == pytest.approx(brute_force(q, s, total, 1, hi))
    assert best.round_ms == pytest.approx(round_ms(np.array(q), np.array(s), best.batches))


def test_micro_batches_are_whole_units() -> None:
    q, s = [1.0, 3.0, 0.5], [5.0, 5.0, 40.0]
    best = best_split(np.array(q), np.array(s), 48, 8, 48, unit=8)
    assert int(best.batches.sum()) == 48 and all(b % 8 == 0 for b in best.batches)
    assert best.round_ms == pytest.approx(brute_force(q, s, 48, 8, 48, unit=8))


def test_bounds_that_cannot_make_up_the_total_are_refused() -> None:
    with pytest.raises(ValueError):
        best_split(np.array([1.0, 1.0]), np.array([0.0, 0.0]), 30, 1, 10)
    with pytest.raises(ValueError):
        best_split(np.array([1.0]), np.array([0.0]), 30, 1, 30, unit=7)


def test_a_fixed_cost_that_hides_a_units_time_still_gives_a_plan_of_the_total() -> None:
    """At s = 1e9 ms a float cannot tell q·b + s for q = 1e-9 ms from s: every level's caps jump
    past B or fall short of it, and the plan is topped up to B."""
    best = best_split(np.full(3, 1e-9), np.full(3, 1e9), 6, 1, 6)
    assert int(best.batches.sum()) == 6 and all(1 <= b <= 6 for b in best.batches)
    assert best.round_ms == pytest.approx(1e9)


def test_caps_far_off_the_total_are_brought_to_it_in_a_few_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """At s = 1e12 ms a float's step is 1.2e-4 ms, 1.2e8 units of q = 1e-12 ms: the caps of any level
    are off B by up to that many, and one unit a worker a pass took B / N passes (100,000 / 2 here,
    2**52 at B = 2**53)."""
    passes = []
    for name in ("_trim", "_fill"):
        step = getattr(optimum, name)
        monkeypatch.setattr(optimum, name, lambda *a, step=step: passes.append(a[3]) or step(*a))
    for total, q, s in ((100_000, [1e-12] * 2, [1e12] * 2), (10_000_000, [1e-12, 3e-12, 2e-12], [1e12, 1e12, 5e11])):
        passes.clear()
        best = best_split(np.array(q), np.array(s), total, 1, total)
        assert int(best.batches.sum()) == total and len(passes) <= 4, passes[:8]


@pytest.mark.parametrize("seed", range(30))
def test_minimums_above_a_unit_give_a_plan_of_the_total_within_the_bounds(seed: int) -> None:
    """Parking a worker at its minimum of 2 or 3 can leave the plan short of B; the rest make it up.
    A total no count of workers makes up within the bounds is refused."""
    rnd = np.random.default_rng(seed)
    n = int(rnd.integers(1, 4))
    q = rnd.lognormal(0.0, 0.7, n).round(3).tolist()
    s = rnd.choice([0.0, 2.0, 30.0], n).tolist()
    lo = int(rnd.integers(2, 4))
    total = int(rnd.integers(lo, 13))
    hi = int(rnd.integers(max(lo + 1, -(-total // n)), total + 2))
    least = brute_force(q, s, total, lo, hi)
    if least == np.inf:
        with pytest.raises(ValueError):
            best_split(np.array(q), np.array(s), total, lo, hi)
        return
    best = best_split(np.array(q), np.array(s), total, lo, hi)
    assert int(best.batches.sum()) == total and all(b == 0 or lo <= b <= hi for b in best.batches)
    assert best.round_ms >= least - 1e-9


def test_three_equal_workers_with_a_minimum_of_two_split_five_as_three_and_two() -> None:
    best = best_split(np.ones(3), np.zeros(3), 5, 2, 5)
    assert sorted(best.batches.tolist()) == [0, 2, 3] and best.round_ms == brute_force([1.0] * 3, [0.0] * 3, 5, 2, 5)


def test_bounds_with_a_gap_no_count_of_workers_makes_up_are_refused() -> None:
    with pytest.raises(ValueError):
        best_split(np.ones(3), np.zeros(3), 5, 2, 2)
    with pytest.raises(ValueError):
        best_split(np.ones(2), np.zeros(2), 5, 3, 4)

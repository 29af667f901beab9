"""ps.control.auto.probes: which changed workers are probed SPREAD up, the plan around the probes, and
the batch a worker back from parking comes back at."""

from __future__ import annotations

from collections.abc import Callable

from ps.control.auto.probes import entry_targets, line_entry, probe_plan, probe_targets

LOWER = {"a": 2, "b": 1}
UPPER = {"a": 20, "b": 20}
CURRENT = {"a": 2, "b": 8}
MEANS = {"a": 5.0, "b": 20.0}
"""`a` held at its minimum batch finishes long before `b`."""


def test_an_early_worker_at_its_minimum_that_the_plan_holds_there_is_probed_spread_up() -> None:
    assert probe_targets(["a"], {"a": 2, "b": 8}, CURRENT, MEANS, LOWER, UPPER, deadband=0.1) == {"a": 4}


def test_a_worker_the_plan_parks_is_not_probed() -> None:
    """Its times at its minimum finish after the solved round: a probe would bring back a parked worker."""
    assert probe_targets(["a"], {"a": 0, "b": 10}, CURRENT, MEANS, LOWER, UPPER, deadband=0.1) == {}


def test_a_worker_within_the_deadband_of_the_slowest_or_that_the_plan_moves_up_is_not_probed() -> None:
    assert probe_targets(["a"], {"a": 2, "b": 8}, CURRENT, {"a": 19.0, "b": 20.0}, LOWER, UPPER, deadband=0.1) == {}
    assert probe_targets(["a"], {"a": 4, "b": 6}, CURRENT, MEANS, LOWER, UPPER, deadband=0.1) == {}


def test_an_early_worker_above_its_minimum_that_the_plan_holds_is_probed_spread_up() -> None:
    """A proportional line through a few samples' times, mostly fixed cost, prices it as slow wherever it is."""
    assert probe_targets(["a"], {"a": 3, "b": 7}, {"a": 3, "b": 7}, MEANS, LOWER, UPPER, deadband=0.1) == {"a": 5}


def test_a_worker_whose_probe_would_outlast_the_planned_round_is_not_probed() -> None:
    """A worker that slowed at a large batch finishes early only because a slower one holds the round
    up: the plan cuts it, and a probe SPREAD up, priced in proportion to its batch, would outlast the
    plan's round (phase 3 of the swap schedule: probed from 129 to 155 samples, a round of 1.3 s)."""
    current, means = {"a": 129, "b": 125}, {"a": 1027.0, "b": 1564.0}
    assert probe_targets(["a"], {"a": 72, "b": 40}, current, means, LOWER, {"a": 500, "b": 500}, deadband=0.1) == {}


def test_the_probe_plan_scales_the_others_to_what_the_probes_leave_and_keeps_the_parked_at_zero() -> None:
    plan = probe_plan({"a": 2, "b": 8, "c": 0}, {"a": 4}, 10, {**LOWER, "c": 1}, {**UPPER, "c": 20},
                      exact_sum=True, for_time=False)
    assert plan == {"a": 4, "b": 6, "c": 0}


def line(q: float, s: float) -> Callable[[int], float]:
    return lambda b: q * b + s


ENTRY_LOWER = {"a": 1, "b": 1, "d": 1}
ENTRY_UPPER = {"a": 64, "b": 64, "d": 64}
CORES = {"a": 1.0, "b": 1.0, "d": 2.0}


def test_a_worker_back_from_parking_takes_the_batch_its_known_law_finishes_within_the_round_measured_now() -> None:
    """The solve gave `d` its minimum; its law finishes 25 samples within the round of 40 ms and the
    deadband (44 ms)."""
    plan = {"a": 40, "b": 23, "d": 1}
    assert entry_targets(["d"], plan, {"d": line(0.16, 40.0)}, 40.0, 0.1, CORES, 64, ENTRY_LOWER,
                         ENTRY_UPPER) == {"d": 25}


def test_without_a_known_law_it_takes_its_cores_share_and_never_less_than_the_plan_gives_it() -> None:
    plan = {"a": 20, "b": 20, "d": 24}
    assert entry_targets(["d"], plan, {}, 40.0, 0.1, CORES, 64, ENTRY_LOWER, ENTRY_UPPER) == {"d": 32}
    assert entry_targets(["d"], plan, {"d": line(1.0, 30.0)}, 40.0, 0.1, CORES, 64, ENTRY_LOWER,
                         ENTRY_UPPER) == {"d": 24}  # its law finishes 14 within the round: the plan's 24 stand


def test_workers_back_from_parking_leave_the_others_their_minimum_cut_back_alike() -> None:
    plan = {"a": 62, "b": 1, "d": 1}
    fast = {k: line(0.01, 1.0) for k in ("b", "d")}  # each would take its upper bound, 64
    assert entry_targets(["b", "d"], plan, fast, 40.0, 0.1, CORES, 64, ENTRY_LOWER, ENTRY_UPPER) == {"b": 31, "d": 31}
    assert entry_targets(["d"], {"a": 0, "b": 63, "d": 1}, fast, 40.0, 0.1, CORES, 64, ENTRY_LOWER,
                         ENTRY_UPPER) == {"d": 63}  # `a` stays parked, `b` keeps its minimum


def test_a_shaped_workers_round_is_its_price_not_its_mean_scaled() -> None:
    """A sped-up worker priced with its old law's shape (`f`, 47 -> 108 samples) finishes at its price
    there (36 ms), not at its mean scaled with its batch (40.2 ms): an unchanged worker whose probe
    would finish at 40.8 ms is within the deadband of the scaled round, not of the priced one."""
    means = {"f": 17.5, "s": 68.0, "u": 34.0}
    current = {"f": 47, "s": 91, "u": 60}
    plan = {"f": 108, "s": 26, "u": 60}
    lower, upper = dict.fromkeys(plan, 1), dict.fromkeys(plan, 512)
    assert probe_targets(["u"], plan, current, means, lower, upper, 0.1) == {"u": 72}
    assert probe_targets(["u"], plan, current, means, lower, upper, 0.1, {"f": lambda b: 36.0 * b / 108}) == {}


def test_a_reprobed_worker_on_a_line_through_the_origin_comes_back_at_a_few_samples_not_a_share_of_b() -> None:
    """`d` was measured at 64 samples only, 150 ms a sample: at its cores' share it would take 32 of B,
    4.8 s against a round of 40 ms. Its line finishes none within the round: it comes back at its
    minimum, SPREAD below 64, where its time gives it its fixed cost."""
    slow = (line(150.0, 0.0), 64)
    assert entry_targets(["d"], {"a": 40, "b": 23, "d": 1}, {}, 40.0, 0.1, CORES, 64, ENTRY_LOWER, ENTRY_UPPER,
                         {"d": slow}) == {"d": 1}


def test_a_line_entry_is_a_batch_size_spread_from_the_one_the_line_was_measured_at() -> None:
    assert line_entry(line(1.0, 0.0), 10, 30.0, 1, 64) == 30  # within the round and SPREAD above
    assert line_entry(line(1.0, 0.0), 10, 4.0, 1, 64) == 4  # within the round and SPREAD below
    assert line_entry(line(1.0, 0.0), 10, 11.0, 1, 64) == 8  # 11 is too near 10: the largest SPREAD below
    assert line_entry(line(10.0, 0.0), 1, 11.0, 1, 64) == 3  # measured at its minimum: the smallest SPREAD above
    assert line_entry(line(10.0, 0.0), 2, 11.0, 2, 3) == 3  # ... within its bound

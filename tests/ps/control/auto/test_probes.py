"""ps.control.auto.probes: which changed workers are probed SPREAD up, and the plan around the probes."""

from __future__ import annotations

from ps.control.auto.probes import probe_plan, probe_targets

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


def test_a_worker_within_the_deadband_of_the_slowest_or_above_its_minimum_is_not_probed() -> None:
    assert probe_targets(["a"], {"a": 2, "b": 8}, CURRENT, {"a": 19.0, "b": 20.0}, LOWER, UPPER, deadband=0.1) == {}
    assert probe_targets(["a"], {"a": 3, "b": 7}, {"a": 3, "b": 7}, MEANS, LOWER, UPPER, deadband=0.1) == {}


def test_the_probe_plan_scales_the_others_to_what_the_probes_leave_and_keeps_the_parked_at_zero() -> None:
    plan = probe_plan({"a": 2, "b": 8, "c": 0}, {"a": 4}, 10, {**LOWER, "c": 1}, {**UPPER, "c": 20},
                      exact_sum=True, for_time=False)
    assert plan == {"a": 4, "b": 6, "c": 0}

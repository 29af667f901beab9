"""benchmarks.simulation.metrics: the plan change, decisions to steady and a phase's figures."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.simulation.engine import Event, Scenario, simulate
from benchmarks.simulation.metrics import decisions_to_steady, mean_round, phase, phases, plan_change
from benchmarks.simulation.population import SpeedLaw


def plans(*rows: list[int]) -> list[np.ndarray]:
    return [np.array(r) for r in rows]


def test_a_plan_change_is_a_batchs_move_or_the_share_of_b_parked_or_unparked() -> None:
    a, b = np.array([50, 50, 0]), np.array([45, 55, 0])
    assert plan_change(a, a, 100) == 0.0
    assert plan_change(a, b, 100) == pytest.approx(0.1)  # 45 from 50
    assert plan_change(a, np.array([40, 50, 10]), 100) == pytest.approx(0.2)  # a worker 20% down, 10% of B unparked
    assert plan_change(np.array([60, 40]), np.array([60, 40, 0]), 100) == 0.0  # a worker joined at 0


def test_decisions_to_steady() -> None:
    steady_at_two = plans([50, 50], [70, 30], [80, 20], [81, 19], [80, 20], [81, 19])
    assert decisions_to_steady(steady_at_two, 100, 0.1) == 2
    assert decisions_to_steady(steady_at_two, 100, 0.1, min_tail=4) is None  # only three decisions keep it
    assert decisions_to_steady(plans([50, 50], [50, 50], [50, 50], [50, 50]), 100, 0.1) == 0
    late = plans([50, 50], [80, 20], [80, 20], [80, 20], [80, 20], [60, 40], [60, 40], [60, 40], [60, 40])
    assert decisions_to_steady(late, 100, 0.1) == 5  # the late move counts


def test_a_runs_phases_are_cut_at_its_events() -> None:
    sc = Scenario(policy="dynamic", workers=8, global_batch=256, rounds=60, events=[Event(30, "speed", fraction=0.5)])
    trace = simulate(sc)
    assert phases(trace) == [(0, 30), (30, 60)]
    first, second = (phase(trace, a, b) for a, b in phases(trace))
    assert first["decisions"] == second["decisions"] == 6
    assert first["round_over_optimum"] >= 1.0 and second["round_over_optimum"] >= 1.0
    assert first["optimum_ms"] != second["optimum_ms"]


def test_a_phases_mean_round_counts_every_plan_in_force_for_the_rounds_it_ran() -> None:
    """The equal split's opening rounds, held up by a worker 300 times slower a sample, are most of
    the run's time; the plan the run ends with shows none of it."""
    law = SpeedLaw(given=[(0.5, 2.0)] * 3 + [(150.0, 2.0)])
    trace = simulate(Scenario(policy="auto", workers=4, global_batch=256, rounds=40, law=law))
    whole = phase(trace, 0, 40)
    by_hand = sum(trace.round_of(plan, max(r, 0)) * (min(until, 40) - r) for (r, _, plan), until
                  in zip(trace.plans, [p[0] for p in trace.plans[1:]] + [40]) if r < 40) / 40
    assert mean_round(trace, 0, 40) == pytest.approx(by_hand)
    assert whole["mean_round_over_optimum"] > 5 * whole["round_over_optimum"]


def test_a_decision_after_an_eviction_is_judged_with_the_workers_it_planned_for() -> None:
    """A failure is evicted as its round closes, before that round's decision: the decision plans for
    the two workers left, so it opens the next phase, and the phase before ends with the plan of
    three (a plan of two against the optimum of three read 0.875). With workers joining in that
    round too, the decision's plan is never in force (the joins' replan follows it at once)."""
    law = SpeedLaw(noise=0.0, given=[(0.01, 0.0)])
    trace = simulate(Scenario(policy="uniform", workers=3, global_batch=6, rounds=10, adjust_every=1, law=law,
                              server_fixed_ms=0.0, events=[Event(5, "fail", count=1)]))
    assert phases(trace) == [(0, 6), (6, 10)]
    before, after = (phase(trace, a, b) for a, b in phases(trace))
    assert (before["decisions"], after["decisions"]) == (5, 4)
    assert before["round_over_optimum"] == after["round_over_optimum"] == 1.0
    assert trace.decisions[5].round == 5 and trace.decisions[5].workers_from == 6
    joined = simulate(Scenario(policy="uniform", workers=3, global_batch=6, rounds=10, adjust_every=1, law=law,
                               server_fixed_ms=0.0, events=[Event(5, "fail", count=1), Event(5, "join", count=1)]))
    assert [phase(joined, a, b)["round_over_optimum"] for a, b in phases(joined)] == [1.0, 1.0]

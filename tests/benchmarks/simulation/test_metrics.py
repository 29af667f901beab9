"""benchmarks.simulation.metrics: the plan change, decisions to steady and a phase's figures."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.simulation.engine import Event, Scenario, simulate
from benchmarks.simulation.metrics import decisions_to_steady, phase, phases, plan_change


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

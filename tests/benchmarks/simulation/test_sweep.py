"""benchmarks.simulation.sweep: the grid of policies and worker counts, its summary, targets and table."""

from __future__ import annotations

from benchmarks.simulation.engine import Scenario
from benchmarks.simulation.sweep import FIXED_SPLITS, grid, scenarios, summary, table, targets


def test_a_small_grid_is_summarised_and_judged() -> None:
    base = Scenario(policy="uniform", workers=4, global_batch=128, rounds=40)
    runs = grid(scenarios(base, ["uniform", "dynamic"], [4, 8], 32, "both", 0.25, 2.0))
    assert len(runs) == 8 and all(r["sum_is_b"] for r in runs)
    assert [len(r["phases"]) for r in runs] == [1, 2] * 4
    rows = summary(runs)
    assert [(r["policy"], r["workers"]) for r in rows] == [("uniform", 4), ("dynamic", 4), ("uniform", 8), ("dynamic", 8)]
    assert all({"decisions_to_steady", "round_over_optimum", "steady_again", "decision_ms_max"} <= set(r) for r in rows)
    goals = targets(rows)
    assert goals and all(g["name"].startswith("simulated dynamic") for g in goals)
    assert "uniform" in FIXED_SPLITS
    steady = next(g for g in goals if g["name"].endswith("decisions to steady"))
    assert isinstance(steady["value"], list) and len(steady["value"]) == 2 and steady["needs"] == "≤ 3 at every N"
    text = table(rows)
    assert text.count("\n") == 5 and "| dynamic | 8 |" in text

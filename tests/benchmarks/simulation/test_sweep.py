"""benchmarks.simulation.sweep: the grid of policies and worker counts, its summary, targets and table."""

from __future__ import annotations

from benchmarks.simulation.engine import Event, Scenario
from benchmarks.simulation.sweep import FIXED_SPLITS, grid, scenarios, summary, table, targets


def test_a_small_grid_is_summarised_and_judged() -> None:
    base = Scenario(policy="uniform", workers=4, global_batch=128, rounds=40)
    runs = grid(scenarios(base, ["uniform", "dynamic"], [4, 8], 32, "both", 0.25, 2.0))
    assert len(runs) == 8 and all(r["sum_is_b"] for r in runs)
    assert [len(r["phases"]) for r in runs] == [1, 2] * 4
    rows = summary(runs)
    assert [(r["policy"], r["workers"]) for r in rows] == [("uniform", 4), ("dynamic", 4), ("uniform", 8), ("dynamic", 8)]
    assert all({"decisions_to_steady", "round_over_optimum", "steady_again", "decision_ms_max"} <= set(r) for r in rows)
    goals = targets(rows, 0.25)
    assert goals and all(g["name"].startswith("simulated dynamic") for g in goals)
    assert "uniform" in FIXED_SPLITS
    steady = next(g for g in goals if g["name"].endswith("decisions to steady"))
    assert isinstance(steady["value"], list) and len(steady["value"]) == 2 and steady["needs"] == "≤ 3 at every N"
    text = table(rows)
    assert text.count("\n") == 5 and "| dynamic | 8 |" in text


def test_a_row_reads_the_phases_at_the_speed_change_whatever_other_events_cut_the_run() -> None:
    base = Scenario(policy="dynamic", workers=4, global_batch=256, rounds=60, events=[Event(5, "fail", count=1)])
    changed, unchanged = grid(scenarios(base, ["dynamic"], [4], 64, "yes", 0.5, 2.0)), grid(
        scenarios(base, ["dynamic"], [4], 64, "no", 0.5, 2.0))
    (run,) = changed
    assert run["change_round"] == 30 and [p["rounds"] for p in run["phases"]] == [[0, 6], [6, 30], [30, 60]]
    (row,) = summary(changed)
    at, after = run["phases"][1], run["phases"][2]  # the phase that ends at the change, the one it starts
    assert at["decisions_to_steady"] is not None  # the short phase before the failure has one decision: never steady
    assert (row["decisions_to_steady"], row["round_over_optimum"]) == (at["decisions_to_steady"], at["round_over_optimum"])
    assert (row["steady_again"], row["round_over_optimum_after"]) == (after["decisions_to_steady"], after["round_over_optimum"])
    ((plain,),) = [r["phases"][-1:] for r in unchanged]  # without the change: the run's last phase
    (row,) = summary(unchanged)
    assert plain["rounds"] == [6, 60] and row["round_over_optimum"] == plain["round_over_optimum"]
    assert [g["name"] for g in targets(summary(changed), 0.5)][2].endswith("decisions to steady after 50% change speed")


def test_a_run_without_decisions_shows_no_cpu_and_no_phase_before_a_change_at_round_0() -> None:
    """--rounds 1 --change yes: no decision to time, and the change at round 0 leaves no phase before
    it; the table says "-" there, and "not steady" only of decisions to steady."""
    base = Scenario(policy="dynamic", workers=2, global_batch=8, rounds=1)
    (row,) = summary(grid(scenarios(base, ["dynamic"], [2], 4, "yes", 0.5, 2.0)))
    line = table([row]).splitlines()[-1]
    assert line.startswith("| dynamic | 2 | not steady | - (-) | - | - / - | ") and "| not steady | 1" in line

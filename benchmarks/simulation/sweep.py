"""The simulator's grid: every policy asked for at every N, with and without a speed change of a
share of the workers halfway, each run judged (metrics.py) and the issue's goals checked. The
goal on the final plan is set on its slowest step against the optimum's, the server's cost aside:
that cost is a parameter here, and at thousands of workers it would dominate both rounds.

A run's record: the scenario, per phase (before the change, after it) its decisions, decisions to
steady, the final plan's round over the optimum, and the policy's CPU. Targets are set for the
policies that measure their workers; `FIXED_SPLITS` split B by a rule no measurement changes, and are
reported without targets."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from benchmarks.simulation import metrics
from benchmarks.simulation.engine import Event, Scenario, describe, simulate

FIXED_SPLITS = ("uniform", "static")
"""Policies whose split no measurement moves: no goal of steadiness or optimality is theirs."""
STEADY_MAX = 3
"""Goal: decisions to a steady plan at every N."""
STEADY_AGAIN_MAX = 2
"""Goal: decisions to a steady plan again after the speed change."""
OPTIMUM_MAX = 1.05
"""Goal: the final plan's round over the exact optimum's."""
CPU_GOALS_MS = {1024: 10.0, 10_000: 100.0}
"""Goal: the policy's CPU per decision (the largest of the run), by N."""
SOURCE = "benchmarks.simulate"


def run_one(scenario: Scenario) -> dict[str, Any]:
    """Simulate `scenario` and judge each of its phases."""
    started = time.process_time()
    trace = simulate(scenario)
    wall = time.process_time() - started
    phases = [metrics.phase(trace, a, b) for a, b in metrics.phases(trace)]
    return {"scenario": describe(scenario), "phases": phases, "cpu": metrics.cpu(trace),
            "plans_checked": len(trace.plans), "sum_is_b": True, "simulation_cpu_s": round(wall, 2)}


def scenarios(base: Scenario, policies: Sequence[str], sizes: Sequence[int], batch_per_worker: int,
              change: str, fraction: float, factor: float) -> list[tuple[Scenario, bool]]:
    """The grid's runs, each a scenario and whether it has the speed change: every policy at every N
    (global batch `batch_per_worker` · N), without the change and with it (`change`: "no", "yes" or
    "both"), the change at half the rounds. Each scenario is checked as it is built (ValueError), so
    a grid that cannot run fails before any of it does."""
    variants = {"no": [False], "yes": [True], "both": [False, True]}[change]
    out = []
    for n in sizes:
        for policy in policies:
            for changed in variants:
                events = [Event(base.rounds // 2, "speed", fraction=fraction, factor=factor)] if changed else []
                out.append((replace(base, policy=policy, workers=n, global_batch=batch_per_worker * n,
                                    events=[*base.events, *events]), changed))
    return out


def grid(runs: Sequence[tuple[Scenario, bool]], progress: Callable[[str], None] = lambda _: None) -> list[dict[str, Any]]:
    """Every run of `scenarios`, simulated and judged."""
    records = []
    for sc, changed in runs:
        record = run_one(sc)
        record["speed_change"] = changed
        records.append(record)
        first = record["phases"][0]
        progress(f"{sc.policy} N={sc.workers} change={changed}: steady {first['decisions_to_steady']}, "
                 f"round/opt {first['round_over_optimum']}, decision max {record['cpu']['decision_ms_max']} ms, "
                 f"{record['simulation_cpu_s']} s")
    return records


def _cell(run: dict[str, Any], phase: int, key: str) -> Any:
    phases = run["phases"]
    return phases[phase][key] if len(phases) > phase else None


def summary(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per policy and N: the run without the change for steadiness, optimality and CPU (the
    run with it where there is none without), and the run with it for what follows the change."""
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for run in runs:
        sc = run["scenario"]
        row = rows.setdefault((sc["policy"], sc["workers"]), {"policy": sc["policy"], "workers": sc["workers"]})
        if not run["speed_change"] or "decisions_to_steady" not in row:
            row.update(decisions_to_steady=_cell(run, 0, "decisions_to_steady"),
                       round_over_optimum=_cell(run, 0, "round_over_optimum"),
                       compute_over_optimum=_cell(run, 0, "compute_over_optimum"),
                       decision_ms_median=run["cpu"]["decision_ms_median"],
                       decision_ms_max=run["cpu"]["decision_ms_max"],
                       policy_ms_per_round=run["cpu"]["round_ms_policy"])
        if run["speed_change"]:
            row.update(steady_again=_cell(run, 1, "decisions_to_steady"),
                       round_over_optimum_after=_cell(run, 1, "round_over_optimum"),
                       compute_over_optimum_after=_cell(run, 1, "compute_over_optimum"))
    return list(rows.values())


def targets(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's goals per measuring policy, each over every N simulated (one value per N, in order)."""
    out = []
    for policy in dict.fromkeys(r["policy"] for r in rows):
        if policy in FIXED_SPLITS:
            continue
        mine = sorted((r for r in rows if r["policy"] == policy), key=lambda r: r["workers"])
        sizes = "/".join(str(r["workers"]) for r in mine)
        out.append(_goal(f"simulated {policy}, N = {sizes}: decisions to steady",
                         [r.get("decisions_to_steady") for r in mine], STEADY_MAX))
        out.append(_goal(f"simulated {policy}, N = {sizes}: final plan's slowest step / exact optimum's",
                         [r.get("compute_over_optimum") for r in mine], OPTIMUM_MAX))
        if any("steady_again" in r for r in mine):
            out.append(_goal(f"simulated {policy}, N = {sizes}: decisions to steady after 20% change speed",
                             [r.get("steady_again") for r in mine], STEADY_AGAIN_MAX))
        for n, goal in CPU_GOALS_MS.items():
            at = [r for r in mine if r["workers"] == n]
            if at:
                out.append(_goal(f"simulated {policy}, N = {n}: CPU per decision, ms (largest)",
                                 [at[0]["decision_ms_max"]], goal))
    return out


def _goal(name: str, values: list[Any], most: float) -> dict[str, Any]:
    """A target met when every value is at most `most` (None, never steady, fails it)."""
    shown = values[0] if len(values) == 1 else values
    passed = all(v is not None and v <= most for v in values)
    return {"name": name, "value": shown, "needs": f"≤ {most:g}" + (" at every N" if len(values) > 1 else ""),
            "pass": passed, "source": SOURCE}


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The summary as a markdown table."""
    head = ("| policy | N | decisions to steady | round / optimum (compute alone) | CPU per decision, ms "
            "(median / max) | policy CPU per round, ms | after the change: steady again | round / optimum (compute alone) |\n"
            "|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        lines.append(f"| {r['policy']} | {r['workers']} | {_show(r.get('decisions_to_steady'))} "
                     f"| {_show(r.get('round_over_optimum'))} ({_show(r.get('compute_over_optimum'))}) "
                     f"| {_show(r.get('decision_ms_median'))} / "
                     f"{_show(r.get('decision_ms_max'))} | {_show(r.get('policy_ms_per_round'))} "
                     f"| {_show(r.get('steady_again', '-'))} | {_show(r.get('round_over_optimum_after', '-'))} "
                     f"({_show(r.get('compute_over_optimum_after', '-'))}) |")
    return "\n".join(lines)


def _show(value: Any) -> str:
    if value is None:
        return "not steady"
    if isinstance(value, float):
        return f"{value:.3g}" if value < 1000 else f"{value:.0f}"
    return str(value)

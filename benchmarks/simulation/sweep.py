"""The simulator's grid: every policy asked for at every N, with and without a speed change of a
share of the workers halfway, each run judged (metrics.py) and the issue's goals checked. The
goal on the final plan is set on its slowest step against the optimum's, the server's cost aside:
that cost is a parameter here, and at thousands of workers it would dominate both rounds.

A run's record: the scenario, the round of its speed change (None without), per phase (the rounds
between two events: the speed change, a join, a leave, a failure) its decisions, decisions to
steady, the final plan's round and the phase's mean round over the optimum, and the policy's CPU. A row of the summary reads
the phase in force when the speed change comes (the one that ends at its round; in a run without
the change, the run's last phase) and, with the change, the phase that starts at its round.
Targets are set for the policies that measure their workers; `FIXED_SPLITS` split B by a rule no measurement changes, and are
reported without targets."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
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
              change: str, fraction: float, factor: float) -> list[tuple[Scenario, int | None]]:
    """The grid's runs, each a scenario and the round of its speed change (None: without one): every policy at every N
    (global batch `batch_per_worker` · N), without the change and with it (`change`: "no", "yes" or
    "both"), the change at half the rounds. Each scenario is checked as it is built (ValueError), so
    a grid that cannot run fails before any of it does."""
    variants = {"no": [False], "yes": [True], "both": [False, True]}[change]
    out = []
    for n in sizes:
        for policy in policies:
            for changed in variants:
                at = base.rounds // 2 if changed else None
                events = [] if at is None else [Event(at, "speed", fraction=fraction, factor=factor)]
                out.append((replace(base, policy=policy, workers=n, global_batch=batch_per_worker * n,
                                    events=[*base.events, *events]), at))
    return out


def grid(runs: Sequence[tuple[Scenario, int | None]],
         progress: Callable[[str], None] = lambda _: None) -> list[dict[str, Any]]:
    """Every run of `scenarios`, simulated and judged."""
    records = []
    for sc, change_round in runs:
        record = run_one(sc)
        record["speed_change"], record["change_round"] = change_round is not None, change_round
        records.append(record)
        steady = phase_at_change(record)
        progress(f"{sc.policy} N={sc.workers} change={record['speed_change']}: "
                 f"steady {_cell(steady, 'decisions_to_steady')}, round/opt {_cell(steady, 'round_over_optimum')}, "
                 f"decision max {record['cpu']['decision_ms_max']} ms, {record['simulation_cpu_s']} s")
    return records


def phase_at_change(run: Mapping[str, Any]) -> dict[str, Any] | None:
    """The phase of `run` in force when its speed change comes: the one ending at the change's round
    (None where the change is at round 0), or in a run without the change its last phase."""
    if run["change_round"] is None:
        return run["phases"][-1]
    return next((p for p in run["phases"] if p["rounds"][1] == run["change_round"]), None)


def phase_after_change(run: Mapping[str, Any]) -> dict[str, Any] | None:
    """The phase of `run` that starts at its speed change's round (None in a run without the change)."""
    return next((p for p in run["phases"] if p["rounds"][0] == run["change_round"]), None)


def _cell(phase: Mapping[str, Any] | None, key: str) -> Any:
    return None if phase is None else phase[key]


def summary(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per policy and N: the run without the change for steadiness, optimality and CPU (the
    run with it where there is none without), each from its phase in force when the change comes
    (`phase_at_change`), and the run with it for the phase that starts at the change."""
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for run in runs:
        sc = run["scenario"]
        row = rows.setdefault((sc["policy"], sc["workers"]), {"policy": sc["policy"], "workers": sc["workers"]})
        if not run["speed_change"] or "decisions_to_steady" not in row:
            steady = phase_at_change(run)
            row.update(decisions_to_steady=_cell(steady, "decisions_to_steady"),
                       round_over_optimum=_cell(steady, "round_over_optimum"),
                       compute_over_optimum=_cell(steady, "compute_over_optimum"),
                       mean_round_over_optimum=_cell(steady, "mean_round_over_optimum"),
                       decision_ms_median=run["cpu"]["decision_ms_median"],
                       decision_ms_max=run["cpu"]["decision_ms_max"],
                       policy_ms_per_round=run["cpu"]["round_ms_policy"])
        if run["speed_change"]:
            after = phase_after_change(run)
            row.update(steady_again=_cell(after, "decisions_to_steady"),
                       round_over_optimum_after=_cell(after, "round_over_optimum"),
                       compute_over_optimum_after=_cell(after, "compute_over_optimum"),
                       mean_round_over_optimum_after=_cell(after, "mean_round_over_optimum"))
    return list(rows.values())


def targets(rows: Sequence[dict[str, Any]], fraction: float) -> list[dict[str, Any]]:
    """The issue's goals per measuring policy, each over every N simulated (one value per N, in order);
    `fraction`: the share of the workers whose speed changes."""
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
            out.append(_goal(f"simulated {policy}, N = {sizes}: decisions to steady after {fraction * 100:g}% change speed",
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
    """The summary as a markdown table: a missing count of decisions to steady reads "not steady",
    any other missing value "-" (no decision to time, no phase before a change at round 0)."""
    head = ("| policy | N | decisions to steady | round / optimum (compute alone) | mean round / optimum "
            "| CPU per decision, ms (median / max) | policy CPU per round, ms | after the change: steady again "
            "| round / optimum (compute alone) | mean round / optimum |\n"
            "|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        lines.append(f"| {r['policy']} | {r['workers']} | {_show(r.get('decisions_to_steady'), 'not steady')} "
                     f"| {_show(r.get('round_over_optimum'))} ({_show(r.get('compute_over_optimum'))}) "
                     f"| {_show(r.get('mean_round_over_optimum'))} | {_show(r.get('decision_ms_median'))} / "
                     f"{_show(r.get('decision_ms_max'))} | {_show(r.get('policy_ms_per_round'))} "
                     f"| {_show(r.get('steady_again', '-'), 'not steady')} | {_show(r.get('round_over_optimum_after', '-'))} "
                     f"({_show(r.get('compute_over_optimum_after', '-'))}) "
                     f"| {_show(r.get('mean_round_over_optimum_after', '-'))} |")
    return "\n".join(lines)


def _show(value: Any, missing: str = "-") -> str:
    if value is None:
        return missing
    if isinstance(value, float):
        return f"{value:.3g}" if value < 1000 else f"{value:.0f}"
    return str(value)

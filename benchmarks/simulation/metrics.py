"""What a simulated run is judged by: how many decisions the policy takes to a steady plan (from the
start, and again after a speed change), how far its plan's round is from the exact optimum's (the
plan it ends with, and the mean of the rounds it ran), and what its decisions cost in CPU.

Plan change. Two plans P and P' (batches by worker, 0: parked or absent) differ by
d(P, P') = max(largest |P'_k − P_k| / P_k over the workers with a batch in both,
               Σ of the batches of the workers with a batch in only one of them / B):
a worker's batch moving by a fraction of itself (what Eq. 7's deadband measures), or the share of B
that moves to or from parked workers (a re-probe of a parked worker moves its share of B, not 100% of
a batch).

Decisions to steady. Over a phase (from the start, or from an event's round) with the plan in force
at its start P_0 and the plans after its decisions P_1 .. P_D, it is the least i such that every later
plan is within the deadband of P_i: d(P_i, P_j) < deadband for every j > i. It is None (not steady)
when fewer than `min_tail` decisions follow P_i in the phase: a plan is called steady only once
that many decisions have kept it."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.simulation.engine import Trace

MIN_TAIL = 3
"""Decisions a plan must survive within its phase to count as steady."""


def plan_change(before: np.ndarray, after: np.ndarray, total: int) -> float:
    """d(P, P') of the module's docstring (0 for equal plans)."""
    n = max(len(before), len(after))
    a = np.zeros(n, dtype=np.int64)
    b = np.zeros(n, dtype=np.int64)
    a[: len(before)], b[: len(after)] = before, after
    both = (a > 0) & (b > 0)
    moved = float(np.max(np.abs(b[both] - a[both]) / a[both])) if both.any() else 0.0
    switched = float((a[(a > 0) & (b == 0)].sum() + b[(b > 0) & (a == 0)].sum()) / total)
    return max(moved, switched)


def decisions_to_steady(plans: Sequence[np.ndarray], total: int, deadband: float,
                        min_tail: int = MIN_TAIL) -> int | None:
    """The least i with d(plans[i], plans[j]) < deadband for every j > i (plans[0]: the plan in force
    at the phase's start, then one per decision); None when fewer than `min_tail` decisions follow it."""
    last = len(plans) - 1
    for i in range(len(plans)):
        if last - i < min_tail:
            return None
        if all(plan_change(plans[i], plans[j], total) < deadband for j in range(i + 1, len(plans))):
            return i
    return None


def phases(trace: Trace) -> list[tuple[int, int]]:
    """The run cut at every event: [start, end) rounds, the first from round 0."""
    cuts = sorted({0, *trace.event_rounds, trace.scenario.rounds})
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if a < b]


def phase(trace: Trace, start: int, end: int) -> dict[str, Any]:
    """The phase of rounds [start, end) judged: its decisions (those closing its rounds), their plan
    changes, decisions to steady, and the plan it ends with (after its last decision) against the
    exact optimum for the workers of the phase, both noise-free rounds with the server's cost, and
    their slowest steps alone (`compute_over_optimum`: the split's own quality, which a server cost
    growing with N hides at thousands of workers)."""
    sc = trace.scenario
    opening = [p for effective, _, p in trace.plans if effective <= start][-1]
    # a decision at the close of a round whose failure evicted workers planned for those left, not
    # the phase's: it is the next phase's opening plan (or, with workers joining then, never in force)
    decisions = [d for d in trace.decisions if start <= d.round < end and d.workers_from < end]
    plans = [opening, *(d.plan for d in decisions)]
    final = plans[-1]
    optimum = trace.optimum_at(start)
    best = optimum.round_ms + sc.server_ms(int(np.count_nonzero(optimum.batches)))
    compute = trace.round_of(final, start) - sc.server_ms(int(np.count_nonzero(final)))
    alive = trace.speeds_at[max(r for r in trace.speeds_at if r <= start)][2]
    return {
        "rounds": [start, end],
        "decisions": len(decisions),
        "plan_changes": sum(d.changed for d in decisions),
        "decisions_to_steady": decisions_to_steady(plans, sc.global_batch, sc.deadband),
        "round_ms": round(trace.round_of(final, start), 3),
        "optimum_ms": round(best, 3),
        "round_over_optimum": round(trace.round_of(final, start) / best, 4),
        "compute_over_optimum": round(compute / optimum.round_ms, 4),
        "mean_round_over_optimum": round(mean_round(trace, start, end) / best, 4),
        "parked": int(np.count_nonzero((final[: len(alive)] == 0) & alive)),
        "optimum_parked": int(np.count_nonzero((optimum.batches == 0) & alive)),
    }


def mean_round(trace: Trace, start: int, end: int) -> float:
    """The mean noise-free round (with the server's cost) of rounds [start, end), each at the plan in
    force in it: what the phase took, its transitions and re-probes included, which the plan it ends
    with does not show."""
    total, plans = 0.0, trace.plans
    for i, (effective, _, plan) in enumerate(plans):
        until = plans[i + 1][0] if i + 1 < len(plans) else end
        first, last = max(effective, start), min(until, end)
        if first < last:
            total += (last - first) * trace.round_of(plan, first)
    return total / max(1, end - start)


def cpu(trace: Trace) -> dict[str, Any]:
    """The policy's CPU: per decision (median and largest, ms) and per round outside decisions
    (observing the pushes and the round, asking whether a decision is due; ms)."""
    spent = [d.cpu_s * 1000.0 for d in trace.decisions]
    rounds = max(1, len(trace.round_ms))
    return {
        "decision_ms_median": round(statistics.median(spent), 3) if spent else None,
        "decision_ms_max": round(max(spent), 3) if spent else None,
        "round_ms_policy": round((trace.observe_cpu_s + trace.due_cpu_s) * 1000.0 / rounds, 3),
    }

"""The batch-policy comparison (``--case``, or any run of the ``model`` policy): per run, the
decisions it made (and those after the model's probe rounds), the busy-time spread of the workers
above the minimum batch, the model's prediction error, and how close each run's final plan comes to
the optimum over the workers' measured costs.

The measured costs are the model run's last fits (t_i(b) = q_i·b + s_i per worker and the round
overhead c, from its ``adjust`` events): the optimum is the exact integer split minimising
max_i t_i(b_i) + c (``ps.control.model.optperf.best_plan``, checked against brute force in
tests/ps/control/model/test_policy.py), with every worker held at a batch >= 1 and with parking allowed. Each
run's final plan is priced under the same costs; ``of_optimum`` = optimum round / its round.
Pure: events in, numbers out.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks.analysis import Event, of_kind, spread
from ps.control.model.optperf import best_plan

MIN_ROUNDS = 3
"""A decision's "previous" measurement counts for the prediction error when it held this many rounds."""
BUSY_EPOCHS = 3
"""Trailing epochs at the final plan whose busy times are averaged for the spread."""


def policy_record(events: Sequence[Event], min_batch: int = 1) -> dict[str, Any]:
    """Decisions, busy-time spread above the minimum batch and prediction error of one run."""
    adjusts = of_kind(events, "adjust")
    epochs = of_kind(events, "epoch")
    probes = [i for i, e in enumerate(adjusts) if e.get("phase") == "probe"]
    after = adjusts[probes[-1] + 1:] if probes else adjusts[1:]  # the first adjust event is the opening plan
    last = epochs[-1] if epochs else {}
    batches = last.get("batch_sizes") or {}
    busy = {k: t for k, t in _busy_at_final_plan(epochs).items() if batches.get(k, 0) > min_batch}
    errors = []
    for e in adjusts:
        prev = e.get("previous") or {}
        predicted, measured = prev.get("predicted_round_ms"), prev.get("measured_round_ms")
        if predicted and measured and prev.get("rounds", 0) >= MIN_ROUNDS:
            errors.append(abs(predicted - measured) / measured)
    return {
        "decisions": sum(1 for e in adjusts[1:] if e.get("changed")),
        "probe_decisions": len(probes),
        "decisions_after_probe": sum(1 for e in after if e.get("changed")),
        "reprobes": sum(1 for e in adjusts if e.get("phase") == "reprobe"),
        # a parked worker's re-probe and the decision that measured it (parked again, or back in)
        "decisions_after_probe_besides_reprobes": sum(
            1 for i, e in enumerate(after) if e.get("changed") and e.get("phase") != "reprobe"
            and not _after_reprobe(after, i)),
        "parked": sorted(k for k, b in batches.items() if b == 0),
        "busy_spread_above_min_batch": None if len(busy) < 2 else round(spread(busy) or 0.0, 4) or None,
        "prediction_error_median": round(statistics.median(errors), 4) if errors else None,
        "prediction_errors_counted": len(errors),
    }


def _busy_at_final_plan(epochs: Sequence[Event]) -> dict[str, float]:
    """Each worker's busy time (compute ms) averaged over the trailing epochs that ran the final
    plan, at most BUSY_EPOCHS of them: one epoch's mean on a shared machine moves by several percent."""
    if not epochs:
        return {}
    plan = epochs[-1].get("batch_sizes") or {}
    window: list[Mapping[str, float]] = []
    for e in reversed(epochs):
        if (e.get("batch_sizes") or {}) != plan or len(window) == BUSY_EPOCHS:
            break
        window.append(e.get("compute_ms") or {})
    return {k: statistics.fmean(w[k] for w in window) for k in window[0] if all(k in w for w in window)}


def _after_reprobe(adjusts: Sequence[Event], index: int) -> bool:
    """Whether the decision at `index` is the first to measure a re-probe (only `wait` events between)."""
    for e in reversed(adjusts[:index]):
        if e.get("phase") == "reprobe":
            return True
        if e.get("phase") != "wait":
            return False
    return False


def measured_costs(events: Sequence[Event]) -> tuple[dict[str, tuple[float, float]], float] | None:
    """The last fits of a model run: {worker: (q, s)} and c; None without any."""
    for e in reversed(of_kind(events, "adjust")):
        fits = e.get("fits")
        if fits and all("q" in f and "s" in f for f in fits.values()):
            return {k: (float(f["q"]), float(f["s"])) for k, f in fits.items()}, float(e.get("overhead_ms") or 0.0)
    return None


def compare(costs: Mapping[str, tuple[float, float]], overhead: float, global_batch: int, min_batch: int,
            plans: Mapping[str, Mapping[str, int]]) -> dict[str, Any]:
    """The optimum round (held and parked) under `costs` and each run's final plan priced against it."""
    times = {k: (lambda b, q=q, s=s: q * b + s) for k, (q, s) in costs.items()}
    lower, upper = dict.fromkeys(costs, min_batch), dict.fromkeys(costs, global_batch)
    held, _, _ = best_plan(times, global_batch, lower, upper)
    parked_plan, parked, _ = best_plan(times, global_batch, lower, upper, may_park=list(costs), overhead=overhead)

    def round_ms(plan: Mapping[str, int]) -> float | None:
        if set(plan) != set(costs):
            return None
        return max(times[k](b) for k, b in plan.items() if b > 0) + overhead

    best_held, best_parked = round_ms(held), round_ms(parked_plan)
    assert best_held is not None and best_parked is not None
    best = min(best_held, best_parked)
    out: dict[str, Any] = {
        "costs": {k: {"q": q, "s": s} for k, (q, s) in costs.items()}, "overhead_ms": round(overhead, 3),
        "optimum_held": {"plan": held, "round_ms": round(best_held, 3),
                         "samples_per_s": round(global_batch / best_held * 1000, 1)},
        "optimum_parked": {"plan": parked_plan, "parked": parked, "round_ms": round(best_parked, 3),
                           "samples_per_s": round(global_batch / best_parked * 1000, 1)},
        "runs": {},
    }
    for name, plan in plans.items():
        t = round_ms(plan)
        out["runs"][name] = {"plan": dict(plan), "round_ms": None if t is None else round(t, 3),
                             "of_optimum": None if t is None else round(best / t, 4),
                             "of_optimum_held": None if t is None else round(best_held / t, 4)}
    return out

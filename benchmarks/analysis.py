"""Pure functions from a run's metrics events to the numbers the heterogeneity and scale benchmarks report.

No processes and no clock here: every function takes the parsed ``ps-server --metrics-log`` events
(see docs/metrics.md) and returns plain numbers, so the definitions are easy to read and test.

Definitions
-----------
* steady throughput: samples/s over the last ``fraction`` of the epochs, from ``epoch`` events,
  as total samples / total time (each epoch's samples = its samples_per_s x its duration, the
  durations from the cumulative ``wall_s``), not a mean of per-epoch rates.
* balanced: every worker's compute time is within ``tolerance`` (10%) of the workers' mean.
* decision trace (``benchmarks.scale``): per window between two ``adjust`` events, the plan in force,
  each worker's smoothed step time the second one reports, and the mean round on the server's clock.
* adjustments to steady: the controller decisions (``adjust`` events after the first plan, or after
  the start of a window such as a phase of a dynamic schedule) made before the first balanced
  measurement. The measurement is, by ``basis``:
  ``"epoch"``: the mean compute times of an ``epoch`` event (the plan is constant within an epoch
  when the controller decides at epoch ends); ``"adjust"``: the smoothed times an ``adjust`` event's
  decision used (for ``--adjust-every N``, where epochs mix plans).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ps.control.model.break_even import carrying

Event = Mapping[str, Any]


def of_kind(events: Sequence[Event], kind: str) -> list[Event]:
    """The events of one kind, in log order."""
    return [e for e in events if e.get("event") == kind]


def epoch_samples(epochs: Sequence[Event]) -> list[tuple[float, float]]:
    """``(samples, seconds)`` of each epoch, from its rate and the cumulative wall time."""
    out: list[tuple[float, float]] = []
    previous = 0.0
    for e in epochs:
        wall = float(e["wall_s"])
        seconds = max(0.0, wall - previous)
        previous = wall
        rate = e.get("samples_per_s")
        out.append((float(rate) * seconds if rate is not None else 0.0, seconds))
    return out


def steady_throughput(epochs: Sequence[Event], fraction: float = 0.5) -> tuple[float | None, int]:
    """Samples/s over the last ``fraction`` of the epochs (at least one); ``(rate, epochs used)``."""
    if not epochs:
        return None, 0
    counted = max(1, round(len(epochs) * fraction))
    tail = epoch_samples(epochs)[-counted:]
    seconds = sum(s for _, s in tail)
    if seconds <= 0:
        return None, counted
    return sum(n for n, _ in tail) / seconds, counted


def spread(values: Mapping[str, float] | None) -> float | None:
    """max / min of positive values (None if there are fewer than one or a zero)."""
    if not values:
        return None
    vals = [float(v) for v in values.values()]
    if min(vals) <= 0:
        return None
    return max(vals) / min(vals)


def balanced(times: Mapping[str, float] | None, workers: Sequence[str], tolerance: float = 0.1) -> bool:
    """Whether every worker in ``workers`` has a time and all are within ``tolerance`` of their mean."""
    if not times or any(w not in times or times[w] is None for w in workers):
        return False
    vals = [float(times[w]) for w in workers]
    mean = sum(vals) / len(vals)
    return mean > 0 and all(abs(v - mean) <= tolerance * mean for v in vals)


def to_steady(
    events: Sequence[Event],
    workers: Sequence[str],
    *,
    basis: str = "epoch",
    tolerance: float = 0.1,
    after_epoch: int = 0,
    until_epoch: int | None = None,
) -> dict[str, Any]:
    """Decisions until the workers' compute times are balanced, in the window of epochs
    ``(after_epoch, until_epoch]``.

    Returns ``adjustments`` (decisions in the window before the first balanced measurement; None if
    none is balanced), ``plan_changes`` (those of them that changed the plan), ``steady_epoch``
    (the epoch of that measurement: for basis "adjust", the epoch the decision was logged in),
    ``stayed_steady`` (every later measurement in the window balanced too) and ``basis``.
    A decision counts for the window when its event's ``epoch`` (completed epochs when it was made)
    is in ``[after_epoch + 1, ...]``, or ``>= 1`` for the run's start: the first plan has epoch 0 and
    the decision at the end of ``after_epoch`` was made on the previous window's data.
    """
    if basis not in ("epoch", "adjust"):
        raise ValueError(f"basis must be 'epoch' or 'adjust', got {basis!r}")
    hi = float("inf") if until_epoch is None else until_epoch
    decisions = [e for e in of_kind(events, "adjust") if after_epoch + 1 <= int(e.get("epoch", 0)) <= hi]
    if basis == "epoch":
        measurements = [(int(e["epoch"]), e.get("compute_ms")) for e in of_kind(events, "epoch")
                        if after_epoch < int(e["epoch"]) <= hi]
    else:
        measurements = [(int(e["epoch"]), e.get("compute_ms")) for e in decisions]
    flags = [balanced(times, workers, tolerance) for _, times in measurements]
    if True not in flags:
        return {"adjustments": None, "plan_changes": None, "steady_epoch": None, "stayed_steady": False, "basis": basis}
    first = flags.index(True)
    steady_epoch = measurements[first][0]
    if basis == "epoch":
        before = [e for e in decisions if int(e["epoch"]) < steady_epoch]
    else:
        before = decisions[:first]
    return {
        "adjustments": len(before),
        "plan_changes": sum(1 for e in before if e.get("changed")),
        "steady_epoch": steady_epoch,
        "stayed_steady": all(flags[first:]),
        "basis": basis,
    }


def first_reaching(evals: Sequence[Event], target: float) -> Event | None:
    """The first ``eval`` event whose accuracy is at least ``target`` (None if none)."""
    for e in evals:
        if e.get("accuracy") is not None and float(e["accuracy"]) >= target:
            return e
    return None


def accuracy_curve(events: Sequence[Event]) -> list[dict[str, Any]]:
    """The server's ``eval`` events as a curve of ``{"epoch", "accuracy", "seconds"}``, the seconds of
    training from the end of round 0 (``first_round``: every worker set up and stepped once; from the
    job's start where there is none), so that the workers' set-up is left out as a DDP rank's is."""
    started = of_kind(events, "first_round")
    zero = float(started[0]["wall_s"]) if started else 0.0
    return [{"epoch": e["epoch"], "accuracy": e["accuracy"], "seconds": round(float(e["wall_s"]) - zero, 3)}
            for e in of_kind(events, "eval") if e.get("accuracy") is not None]


def global_batch_curve(events: Sequence[Event]) -> list[dict[str, Any]]:
    """An --adaptive-batch run's global batch over time: ``{"seconds", "global_batch"}`` at the start
    (the B before the first decision) and at every ``adapt`` decision, the seconds on the server's
    clock from the end of round 0 (from the job's start where there is none); empty without decisions."""
    decisions = of_kind(events, "adapt")
    if not decisions:
        return []
    started = of_kind(events, "first_round")
    zero = float(started[0]["elapsed_s"]) if started and "elapsed_s" in started[0] else 0.0
    points = [{"seconds": 0.0, "global_batch": int(decisions[0]["current"])}]
    points += [{"seconds": round(max(0.0, float(d["elapsed_s"]) - zero), 3), "global_batch": int(d["global_batch"])}
               for d in decisions]
    return points


Q_ROUNDING, S_ROUNDING = 0.5e-6, 0.5e-4
"""How far a reported law's q and s may be from the policy's: the reports round them to 6 and 4
decimals (the fits in ps/control's `adjust` reports)."""


def below_break_even(events: Sequence[Event]) -> list[dict[str, Any]]:
    """The ``adjust`` decisions whose plan puts an active worker below its break-even batch by the laws
    that decision reports, where another worker is active (docs/adaptive-batch.md: a worker whose
    fixed cost s exceeds its compute q·b is parked): ``{"step", "worker", "batch", "break_even"}``
    each. A decision that waits for measurements (phase ``wait``) decides nothing and is not judged.
    A law counts where it is known: ``law`` true (auto) or measured at two batch sizes or more
    (``batches``, model), and its q measured (``slope_measured``, where reported); a line through the
    origin, or one whose q is within its noise of zero, has no break-even. The break-even is the least
    b with q·b >= s, on the report's rounded q and s (a plan within their rounding of it is not below).
    The worker with the plan's largest batch carries the round and is not judged
    (ps.control.model.break_even.carrying)."""
    out = []
    for e in of_kind(events, "adjust"):
        if e.get("phase") == "wait":
            continue
        plan, fits = e.get("batch_sizes") or {}, e.get("fits") or {}
        active = [k for k, b in plan.items() if b]
        if len(active) < 2:
            continue
        carrier = carrying(plan)
        for k in (k for k in active if k != carrier):
            fit = fits.get(k) or {}
            known = fit.get("law", (fit.get("batches") or 0) >= 2) and fit.get("slope_measured", True)
            q, s = float(fit.get("q") or 0.0), float(fit.get("s") or 0.0)
            # a plan within the report's rounding of q and s of its break-even is not below it
            if known and q > 0 and s > 0 and (q + Q_ROUNDING) * plan[k] + S_ROUNDING < s * (1.0 - 1e-6):
                out.append({"step": e.get("step"), "worker": k, "batch": plan[k],
                            "break_even": math.ceil((s - S_ROUNDING) / (q + Q_ROUNDING) - 1e-6)})
    return out


def time_to_accuracy(curve: Sequence[Event], goal: float) -> float | None:
    """The ``seconds`` of the curve's first point at ``goal`` accuracy or above (None: never)."""
    reached = first_reaching(curve, goal)
    return None if reached is None else float(reached["seconds"])


def accuracy_within(curve: Sequence[Event], budget_s: float) -> float | None:
    """The best accuracy of the curve's points at or before ``budget_s`` seconds (None: none that early)."""
    return max((float(p["accuracy"]) for p in curve if float(p["seconds"]) <= budget_s), default=None)


def target(name: str, value: float | None, op: str, threshold: float, source: str) -> dict[str, Any]:
    """A pass/fail record; ``pass`` is None when the value was not measured (counts as not passed)."""
    if op not in (">=", "<="):
        raise ValueError(f"op must be >= or <=, got {op!r}")
    ok = None if value is None else (value >= threshold if op == ">=" else value <= threshold)
    shown = value if value is None or isinstance(value, int) else round(float(value), 4)
    return {"name": name, "value": shown, "op": op,
            "threshold": threshold, "pass": ok, "source": source}


def fmt(value: Any, digits: int = 3) -> str:
    """A table cell: numbers to ``digits`` significant-ish places, None as a dash."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 10 ** digits else f"{value:.0f}"
    if isinstance(value, Mapping):
        return " ".join(f"{k}={fmt(v)}" for k, v in value.items())
    return str(value)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def decision_trace(events: Sequence[Event], first: int, last: int) -> list[dict[str, Any]]:
    """BSP: between each two policy decisions of rounds `first`..`last`, the plan in force, each
    worker's step time the second decision measured it at (`compute_ms`, the policy's smoothed ms)
    and the mean round (ms, on the server's clock): what benchmarks/simulation/replay.py replays."""
    adjusts = [e for e in events if e["event"] == "adjust" and first <= int(e.get("step", -1)) <= last]
    trace = []
    for before, after in zip(adjusts, adjusts[1:]):
        rounds = int(after["step"]) - int(before["step"])
        if rounds <= 0 or set(after["compute_ms"]) != set(before["batch_sizes"]):
            continue
        trace.append({"step": int(after["step"]), "batch_sizes": before["batch_sizes"],
                      "compute_ms": after["compute_ms"],
                      "round_ms": round(1000.0 * (float(after["time"]) - float(before["time"])) / rounds, 3)})
    return trace

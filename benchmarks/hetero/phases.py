"""A schedule's phases in a run's metrics log: pure functions from the events and the times the
quotas changed to the numbers ``benchmarks.hetero --schedule`` reports per phase.

Definitions
-----------
* span: a phase as it ran, from the moment its quotas were written (phase 0: the schedule's clock
  start, the end of round 0 in BSP, the first plan in ASP) to the next phase's, the last one to the
  schedule's end (its nominal length on the wall clock, the last epoch on an epoch schedule).
* window: one measurement of the log. Basis ``"epoch"``: an ``epoch`` event, from the previous
  epoch's end to its own, with its samples (its samples/s times its duration), the workers' mean
  times, the plan and the updates. Basis ``"adjust"`` (``--adjust-every N``, where epochs mix plans):
  an ``adjust`` event, from the previous decision to its own, with the times the decision used.
* samples/s of a span: the samples of the epochs that overlap it, each epoch's spread evenly over its
  duration and cut at the span's ends, over the time they cover.
* balanced: every worker with a batch (a parked one has none) within ``tolerance`` (10%) of the
  workers' mean time (:func:`benchmarks.analysis.balanced`): the time a balanced round takes.
* time to re-balance after a change: from the change to the start of the first balanced window that
  begins after it (the first window wholly after the change: one taken across it mixes both
  phases). Its resolution is a window's length (``window_s``, their mean in the span: an epoch of
  the default workload is ~2 s on the 2-core VM at HL8). ``decisions_to_rebalance`` /
  ``plan_changes_to_rebalance``: the decisions made from the change up to that window's start (for
  basis epoch: those with a round count at most the window's first; a decision logged at an epoch's
  end has that epoch's count), and those of them that changed the plan.
* a baseline measured phase by phase over the schedule: on the wall clock every phase lasts its
  seconds, so its samples/s is the phases' rates weighted by their seconds; on an epoch schedule
  every phase trains the same samples, so it is their count over the sum of each phase's time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.analysis import Event, balanced, of_kind, spread


@dataclass(frozen=True)
class Window:
    """One measurement: from ``start`` to ``end`` (Unix seconds), rounds ``first_step`` to ``step``."""

    start: float
    end: float
    epoch: int
    first_step: int
    step: int
    samples: float
    times: Mapping[str, float]
    batches: Mapping[str, int]
    updates: Mapping[str, int]

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)

    def active(self) -> list[str]:
        """The workers that trained in this window: a batch above 0 (a parked worker has 0)."""
        return sorted(name for name, b in self.batches.items() if b > 0) or sorted(self.times)

    def balanced(self, tolerance: float) -> bool:
        return balanced(self.times, self.active(), tolerance)


@dataclass(frozen=True)
class Span:
    """One phase as it ran."""

    phase: int
    profile: str
    start: float
    end: float


def epoch_windows(events: Sequence[Event]) -> list[Window]:
    """The ``epoch`` events as windows (an epoch's start: its end less its duration in ``wall_s``)."""
    out: list[Window] = []
    wall, step = 0.0, 0
    for e in of_kind(events, "epoch"):
        end, now = float(e["time"]), float(e["wall_s"])
        seconds = max(0.0, now - wall)
        rate = e.get("samples_per_s")
        out.append(Window(end - seconds, end, int(e["epoch"]), step, int(e.get("step", step)),
                          float(rate) * seconds if rate is not None else 0.0, e.get("compute_ms") or {},
                          e.get("batch_sizes") or {}, e.get("updates") or {}))
        wall, step = now, int(e.get("step", step))
    return out


def adjust_windows(events: Sequence[Event]) -> list[Window]:
    """The ``adjust`` events after the first plan as windows: from the previous decision to this one."""
    adjusts = of_kind(events, "adjust")
    return [Window(float(prev["time"]), float(e["time"]), int(e.get("epoch", 0)), int(prev.get("step", 0)),
                   int(e.get("step", 0)), 0.0, e.get("compute_ms") or {}, prev.get("batch_sizes") or {}, {})
            for prev, e in zip(adjusts, adjusts[1:])]


def spans(profiles: Sequence[str], clock_start: float, switches: Sequence[Mapping[str, Any]], end: float) -> list[Span]:
    """The phases that ran: phase 0 from the clock's start, each switch (``phase``, ``time``) from its
    time, each to the next one's start or ``end``. Phases never reached are left out."""
    starts = [(0, clock_start)] + [(int(sw["phase"]), float(sw["time"])) for sw in switches]
    out = []
    for (phase, start), nxt in zip(starts, [*starts[1:], (None, end)]):
        stop = min(end, float(nxt[1])) if nxt[0] is not None else end
        out.append(Span(phase, profiles[phase], start, max(start, stop)))
    return out


def _overlap(w: Window, start: float, end: float) -> float:
    return max(0.0, min(w.end, end) - max(w.start, start))


def throughput(windows: Sequence[Window], start: float, end: float) -> tuple[float, float]:
    """``(samples, seconds)`` of the epochs within ``[start, end]``, each cut at the ends pro rata."""
    samples = seconds = 0.0
    for w in windows:
        part = _overlap(w, start, end)
        if part > 0 and w.seconds > 0:
            samples += w.samples * part / w.seconds
            seconds += part
    return samples, seconds


def updates(windows: Sequence[Window], start: float, end: float) -> dict[str, float]:
    """Each worker's updates within ``[start, end]``, each epoch's cut at the ends pro rata (ASP)."""
    out: dict[str, float] = {}
    for w in windows:
        part = _overlap(w, start, end)
        if part > 0 and w.seconds > 0:
            for name, n in w.updates.items():
                out[name] = out.get(name, 0.0) + n * part / w.seconds
    return {name: round(n, 1) for name, n in sorted(out.items())}


def update_skew(counts: Mapping[str, float]) -> float | None:
    """Most updates over fewest (None when a worker made none: unbounded)."""
    value = spread(counts)
    return None if value is None else round(value, 4)


def rebalance(windows: Sequence[Window], decisions: Sequence[Event], start: float, end: float, *,
              basis: str = "epoch", tolerance: float = 0.1) -> dict[str, Any]:
    """From ``start`` (a change) to ``end``: the seconds until the first balanced window that begins
    after the change, the decisions and plan changes before it, whether every later window in the span
    stayed balanced, and every decision and plan change of the span."""
    inside = [w for w in windows if w.start >= start - 1e-3 and w.end <= end + 1e-3]
    after = [e for e in decisions if start <= float(e["time"]) < end]
    flags = [w.balanced(tolerance) for w in inside]
    record: dict[str, Any] = {
        "rebalance_s": None, "decisions_to_rebalance": None, "plan_changes_to_rebalance": None,
        "balanced_from_epoch": None, "stayed_balanced": False,
        "decisions": len(after), "plan_changes": sum(1 for e in after if e.get("changed")),
        "windows": len(inside),
        "window_s": round(sum(w.seconds for w in inside) / len(inside), 3) if inside else None,
    }
    if True not in flags:
        return record
    first = flags.index(True)
    w = inside[first]
    if basis == "epoch":
        before = [e for e in after if int(e.get("step", 0)) <= w.first_step]
    else:  # the window's own decision is the one that found it balanced
        before = [e for e in after if float(e["time"]) < w.end]
    record.update({
        "rebalance_s": round(max(0.0, w.start - start), 3), "decisions_to_rebalance": len(before),
        "plan_changes_to_rebalance": sum(1 for e in before if e.get("changed")), "balanced_from_epoch": w.epoch,
        "stayed_balanced": all(flags[first:]),
    })
    return record


def speeds(windows: Sequence[Window], start: float, end: float, last: int = 3) -> dict[str, float]:
    """Each worker's samples/s in the span's last ``last`` windows wholly inside it where it trained:
    its batch over its time, averaged (a parked worker has none)."""
    inside = [w for w in windows if w.start >= start - 1e-3 and w.end <= end + 1e-3]
    rates: dict[str, list[float]] = {}
    for w in reversed(inside):
        for name, b in w.batches.items():
            ms = w.times.get(name)
            if b > 0 and ms and len(rates.setdefault(name, [])) < last:
                rates[name].append(1000.0 * b / float(ms))
    return {name: sum(r) / len(r) for name, r in sorted(rates.items()) if r}


def speeds_by_share(measured: Mapping[str, float], shares: Mapping[str, float]) -> dict[str, float]:
    """Every worker's speed: the measured ones as they are, the others (parked, or never timed) at
    their share times the measured workers' mean samples/s per core (their shares' ratio where
    nobody was timed)."""
    per_core = [measured[n] / shares[n] for n in measured if shares.get(n)]
    unit = sum(per_core) / len(per_core) if per_core else 1.0
    return {n: measured.get(n, shares[n] * unit) for n in shares}


def over_schedule(rates: Sequence[float | None], lengths: Sequence[float], unit: str) -> float | None:
    """A baseline's samples/s over the schedule from its rate in each phase: weighted by the phases'
    seconds on the wall clock; on an epoch schedule (equal samples per phase length) the samples
    over the time each phase's take."""
    known = [r for r in rates if r is not None and r > 0]
    if not rates or len(known) < len(rates):
        return None
    if unit == "seconds":
        return sum(r * d for r, d in zip(known, lengths, strict=True)) / sum(lengths)
    return sum(lengths) / sum(d / r for r, d in zip(known, lengths, strict=True))

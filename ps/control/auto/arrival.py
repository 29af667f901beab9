"""The order the pushes of a BSP round reach the server in, as the auto policy plans it.

The server takes a round's pushes one at a time, each costing it about p ms of its CPU (decoding,
checks, adding it to the sum), and the round closes only after the last one is taken. Pushes that
arrive together queue: the last of n waits (n - 1) p behind the others. Pushes that arrive p apart
queue for nothing, so a plan in which every worker finishes at once is not the fastest: the round is

    T = max over arrival order i of  f_(i) + (n - i + 1) p

(f_(i) the i-th finish), least when each worker finishes p after the one before it. Which worker
takes which slot matters too: a worker that finishes d ms earlier gives up d ms of its compute, d
times its speed in samples, so the slowest worker takes the earliest slot and the fastest the last.
The policy plans this by pricing each worker's finish `offset` ms later (finish_table.Priced), its
slot's distance from the last, and by comparing measured times with the same offsets.

p is measured by the server: its event loop's CPU over the round per push (bsp.py), which holds
each push's own work and a share of the round's step and replies, so it is a little more than the
queue's; the slots together span at most SPAN of the round, so no estimate plans a worker far from
its share. Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ps.control.model.time_fit import Finish

SPAN = 0.1
"""The most of the round that the slots together span: within it every worker still finishes within
10% of the round, what a reader of the times (and the benchmarks) takes for balanced."""


def slot_ms(push_ms: float, round_ms: float, workers: int) -> float:
    """The gap planned between consecutive arrivals: the server's time a push, with n - 1 gaps
    spanning at most SPAN of `round_ms` (0 with fewer than two workers or nothing measured)."""
    if workers < 2 or push_ms <= 0.0 or round_ms <= 0.0:
        return 0.0
    return min(push_ms, SPAN * round_ms / (workers - 1))


def offsets(plan: Mapping[str, int], finish: Callable[[str, int], float], gap_ms: float) -> dict[str, float]:
    """Each active worker's slot offset (ms): 0 for the fastest at its batch in `plan` (samples over
    its `finish` time there), `gap_ms` more for each slower one; parked workers have none."""
    if gap_ms <= 0.0:
        return {}
    rates = {k: b / max(finish(k, b), 1e-9) for k, b in plan.items() if b > 0}
    ranked = sorted(rates, key=lambda k: (-rates[k], k))
    return {k: i * gap_ms for i, k in enumerate(ranked)}


def planned(plan: Mapping[str, int], finishes: Mapping[str, Finish], push_ms: float,
            round_ms: float) -> dict[str, float]:
    """`offsets` of `plan` by the workers' fitted finishes (those without one take none), the gap
    `slot_ms` of the server's `push_ms` and the measured `round_ms`."""
    active = {k: b for k, b in plan.items() if b > 0 and k in finishes}
    return offsets(active, lambda k, b: finishes[k].at(b), slot_ms(push_ms, round_ms, len(active)))


def shifted(times: dict[str, Sequence[float]] | None, offset: Mapping[str, float]
            ) -> dict[str, Sequence[float]] | None:
    """Measured `times` each `offset` later: as the server's queue sees them."""
    if times is None or not offset:
        return times
    return {k: [t + offset.get(k, 0.0) for t in v] for k, v in times.items()}

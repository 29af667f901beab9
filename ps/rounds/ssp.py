"""Stale-synchronous parallel (SSP, as in Petuum and ps-lite) for ASP: per-worker clocks and the gate
of `--staleness-bound s`, and what each update's staleness was. Pure: no clock, no asyncio.

A worker's clock counts its updates the server applied. The workers that count are the running ones:
active (not left, not evicted) and unparked (planned a batch > 0). A worker is `ahead` of the slowest
running worker by its clock minus their smallest clock, and SSP holds a worker back, with the reply to
its update, while it is more than s ahead: it computes its next update only from parameters that hold
every running worker's updates up to s clocks behind its own. That lead, taken when the worker's reply
goes out, is the update's *clock staleness*, never above s. s = 0 is lock-step: every worker applies
one update, then waits for all the others' (synchronous rounds without the weighting).

A worker that starts to count (a join, a rejoin under a new id, an unparking) starts at the slowest
running worker's clock, so it neither holds the others back nor is held for the time it was away; a
worker that stops counting (left, evicted, parked) no longer holds anyone back.

Apart from the gate, an update's *staleness* is in versions, as ASP always counted it: the updates
applied between the version its worker pulled and its own. With W running workers and bound s it
stays within (W − 1)·(2s + 1); `--max-staleness` refuses an update over its limit instead (the worker
pulls and recomputes), with no wait.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


class WorkerClocks:
    """The running workers' clocks and the SSP gate (`bound` None: no gate, the clocks still count)."""

    def __init__(self, bound: int | None = None) -> None:
        if bound is not None and bound < 0:
            raise ValueError(f"the staleness bound must be >= 0, got {bound}")
        self.bound = bound
        self.clocks: dict[str, int] = {}
        self._leads: dict[str, int] = {}  # each worker's lead when it last read: its next update's clock staleness
        self._floor = 0  # the slowest running worker's clock, kept for workers that start when none runs

    def sync(self, running: Iterable[str]) -> None:
        """Take the running workers: newcomers start at the slowest one's clock, the others are forgotten."""
        running = set(running)
        for worker in set(self.clocks) - running:
            del self.clocks[worker], self._leads[worker]
        floor = self.slowest()
        for worker in running - set(self.clocks):
            self.clocks[worker], self._leads[worker] = floor, 0
        self._floor = floor

    def slowest(self) -> int:
        """The smallest clock of a running worker (when none runs, the last one seen)."""
        return min(self.clocks.values(), default=self._floor)

    def ahead(self, worker: str) -> int:
        """How many clocks `worker` is ahead of the slowest running worker (0 if it does not run)."""
        return self.clocks[worker] - self.slowest() if worker in self.clocks else 0

    def held(self, worker: str) -> bool:
        """Whether SSP holds `worker` back: more than `bound` clocks ahead of the slowest."""
        return self.bound is not None and self.ahead(worker) > self.bound

    def read(self, worker: str) -> None:
        """`worker` gets the parameters it computes its next update from (its reply goes out)."""
        if worker in self.clocks:
            self._leads[worker] = self.ahead(worker)

    def tick(self, worker: str) -> int:
        """One more of `worker`'s updates applied; its clock staleness (its lead when it read)."""
        if worker not in self.clocks:
            return 0
        self.clocks[worker] += 1
        return self._leads[worker]


@dataclass
class EpochCounts:
    """One worker's ASP updates in the current epoch: their staleness in versions and in clocks, and
    the SSP waits before its replies (how many, how long)."""

    updates: int = 0
    staleness_sum: int = 0
    staleness_max: int = 0
    clock_staleness_max: int = 0
    waits: int = 0
    wait_s: float = 0.0

    def update(self, staleness: int, clock_staleness: int) -> None:
        """An update of this worker applied: `staleness` versions after the one it was computed from,
        `clock_staleness` clocks ahead of the slowest running worker when it read them."""
        self.updates += 1
        self.staleness_sum += staleness
        self.staleness_max = max(self.staleness_max, staleness)
        self.clock_staleness_max = max(self.clock_staleness_max, clock_staleness)

    def waited(self, seconds: float) -> None:
        """SSP held a reply for `seconds`."""
        self.waits += 1
        self.wait_s += seconds


def epoch_fields(counts: Mapping[str, EpochCounts]) -> dict[str, dict[str, float]]:
    """The `epoch` record's ASP fields, each {worker name: value}: the mean and largest staleness (in
    versions) of the epoch's updates, the largest clock staleness, and SSP's waits (count, seconds)."""
    return {
        "staleness_mean": {k: round(c.staleness_sum / c.updates, 3) if c.updates else 0.0 for k, c in counts.items()},
        "staleness_max": {k: c.staleness_max for k, c in counts.items()},
        "clock_staleness_max": {k: c.clock_staleness_max for k, c in counts.items()},
        "ssp_waits": {k: c.waits for k, c in counts.items()},
        "ssp_wait_s": {k: round(c.wait_s, 3) for k, c in counts.items()},
    }

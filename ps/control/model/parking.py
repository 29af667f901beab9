"""Who is parked (planned at batch 0) by the model and auto policies, and when each comes back for a
re-probe: a parked worker's speed is not measured, so it is brought back now and then at the batch the
split would give it (the auto policy: one that measures its speed, auto/probes.py), and waits twice
as long each time it is parked again (and long enough for its re-probes to take at most REPROBE_SHARE of
the job's time), so that a worker that got faster returns; all of them at once
when the auto policy sees an active worker's times rise by half or more (`recall`), which forgives
what each owes for its last re-probe once while it stays parked. Pure."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ps.control.checks import integer
from ps.control.model.state import nonnegative, parking_entry

CLOCK_CAP_MS = sys.float_info.max
"""Where the schedule's clock and what a worker waits for on it stop (rounds timed at extremes): finite,
so that the state holds them."""
STATE_KEYS = frozenset({"parked", "reprobed", "clock_ms", "forgiven"})
"""The keys of a schedule's state (clock_ms absent in a state that kept no clock: then 0; forgiven
absent: none)."""
REPROBE_FIRST = 2
"""Decisions a newly parked worker waits before its first re-probe."""
REPROBE_MAX = 32
"""The longest wait between re-probes, in decisions, that doubling reaches."""
REPROBE_SHARE = 0.1
"""The share of the job's time a parked worker's re-probes may take: one parked again after a re-probe
that cost X ms of rounds beyond the plan it left waits at least X / REPROBE_SHARE ms of rounds for its
next one, as well as its decisions. A worker whose fixed cost alone outlasts the others' round many
times over holds every round of a re-probe; re-probed every REPROBE_MAX decisions, it would cost the
job a share that grows with that excess."""


@dataclass
class Parked:
    """A parked worker: decisions since it was parked, how many it waits before a re-probe, and the
    schedule's clock (ms of rounds) it waits for as well (REPROBE_SHARE; kept in the policy's state, so
    a resumed job still owes what its re-probes cost)."""

    waited: int
    every: int
    until_ms: float = 0.0


class ParkingSchedule:
    """The parked workers and those brought back for a re-probe not yet judged."""

    def __init__(self) -> None:
        self.parked: dict[str, Parked] = {}
        self.reprobed: dict[str, int] = {}  # back for a re-probe: the wait it had while parked
        # back by a solve, not due (a re-probe raised the round it fits in): its schedule, for one solve
        self.returned: dict[str, Parked] = {}
        self.clock_ms = 0.0  # the rounds' ms since this schedule was made
        self.forgiven: set[str] = set()  # parked, or back for a re-probe, since a recall forgave what they owed

    def tick(self) -> None:
        """A decision passed."""
        for entry in self.parked.values():
            entry.waited += 1

    def elapse(self, round_ms: float) -> None:
        """A round of `round_ms` passed."""
        self.clock_ms = min(self.clock_ms + round_ms, CLOCK_CAP_MS)

    def due(self) -> list[str]:
        """The parked workers whose re-probe is due."""
        return [k for k, e in self.parked.items() if e.waited >= e.every and e.until_ms <= self.clock_ms]

    def owe(self, workers: Iterable[str], cost_ms: float) -> None:
        """Workers parked again after a re-probe that cost `cost_ms` of rounds wait for their next one
        cost_ms / REPROBE_SHARE ms of rounds at least."""
        for k in workers:
            entry = self.parked.get(k)
            if entry is not None and math.isfinite(cost_ms) and cost_ms > 0:
                entry.until_ms = max(entry.until_ms, min(self.clock_ms + cost_ms / REPROBE_SHARE, CLOCK_CAP_MS))

    def keep_time(self, other: ParkingSchedule) -> None:
        """`other`'s clock, and what each worker parked in both waits for on it (a schedule read back
        from a state, which holds neither)."""
        self.clock_ms = other.clock_ms
        for k, entry in self.parked.items():
            was = other.parked.get(k) or other.returned.get(k)
            if was is not None:
                entry.until_ms = was.until_ms
        self.forgiven |= other.forgiven & set(self.parked)

    def recall(self) -> None:
        """Every parked worker due for a re-probe now, its backoff started over: a change of speed seen
        elsewhere often comes with one here, unseen (a swap, a tenant that moved between machines).
        What a worker owes for its last re-probe (`owe`) is forgiven once while it stays parked: where
        quotas make the active workers' times rise and fall with the round's length, a slowdown is
        seen every few decisions, and recalls that always forgave would re-probe a worker whose fixed
        cost is many rounds long at each of them, far beyond REPROBE_SHARE."""
        for k, entry in self.parked.items():
            entry.waited = entry.every = REPROBE_FIRST
            if k not in self.forgiven:
                entry.until_ms = 0.0
                self.forgiven.add(k)

    def install(self, parked: Iterable[str], reprobe: Iterable[str]) -> None:
        """Who is parked after a solve: one parked again right after its re-probe waits twice as long
        as before (up to REPROBE_MAX), and so does one parked again right after a solve brought it back
        unasked (it fit in a round a re-probe lengthened), its wait for time owed kept; a newly parked one REPROBE_FIRST
        decisions, one still parked keeps counting; `reprobe` are brought back now."""
        entries = {}
        for k in parked:
            if k in self.parked:
                entries[k] = self.parked[k]
            elif k in self.reprobed:
                entries[k] = Parked(0, min(REPROBE_MAX, 2 * self.reprobed[k]))
            elif k in self.returned:  # measured in the round it fit in, as a re-probe would have
                back = self.returned[k]
                entries[k] = Parked(0, min(REPROBE_MAX, 2 * back.every), back.until_ms)
            else:
                entries[k] = Parked(0, REPROBE_FIRST)
        reprobe = set(reprobe)
        self.forgiven &= set(entries) | reprobe  # one planned in has ended its stay
        self.reprobed = {k: self.parked[k].every for k in reprobe if k in self.parked}
        self.returned = {k: e for k, e in self.parked.items() if k not in entries and k not in reprobe}
        self.parked = entries

    def park(self, workers: Iterable[str]) -> None:
        """Workers parked by a plan made without a solve (a probe, a split by measured speeds): one
        newly parked waits REPROBE_FIRST decisions, one parked already keeps counting."""
        for k in workers:
            self.parked.setdefault(k, Parked(0, REPROBE_FIRST))

    def forget(self, worker_id: str) -> None:
        """The worker left."""
        self.parked.pop(worker_id, None)
        self.reprobed.pop(worker_id, None)
        self.returned.pop(worker_id, None)
        self.forgiven.discard(worker_id)

    def clear(self) -> None:
        """Nobody is parked (a plan without the fits)."""
        self.parked, self.reprobed, self.returned, self.forgiven = {}, {}, {}, set()

    def state(self) -> dict[str, Any]:
        """As plain data: {"parked": {worker: [waited, every, until ms]}, "reprobed": {worker: wait},
        "clock_ms": the clock, "forgiven": [worker]}."""
        return {"parked": {k: [e.waited, e.every, e.until_ms] for k, e in self.parked.items()},
                "reprobed": dict(self.reprobed), "clock_ms": self.clock_ms, "forgiven": sorted(self.forgiven)}

    @classmethod
    def from_state(cls, state: Any, workers: Iterable[str]) -> ParkingSchedule:
        """Read `state` back (ValueError naming the field on one that is malformed or names a worker
        not in `workers`)."""
        known = set(workers)
        if not isinstance(state, Mapping) or not {"parked", "reprobed"} <= set(state) <= STATE_KEYS:
            raise ValueError("parking state must have the keys parked and reprobed (and may have clock_ms and forgiven)")
        parked, reprobed = state["parked"], state["reprobed"]
        if not isinstance(parked, Mapping) or not set(parked) <= known:
            raise ValueError("parking state 'parked' must map workers of the policy to [waited, every, until ms]")
        if not isinstance(reprobed, Mapping) or not set(reprobed) <= known:
            raise ValueError("parking state 'reprobed' must map workers of the policy to their wait")
        schedule = cls()
        for k, entry in parked.items():
            schedule.parked[k] = Parked(*parking_entry(k, entry))
        schedule.clock_ms = nonnegative("parking clock_ms", state.get("clock_ms", 0.0))
        schedule.reprobed = {k: integer(f"re-probe wait of {k!r}", v, minimum=1) for k, v in reprobed.items()}
        forgiven = state.get("forgiven", [])
        if not (isinstance(forgiven, list) and all(isinstance(k, str) for k in forgiven)
                and set(forgiven) <= set(schedule.parked) | set(schedule.reprobed)):
            raise ValueError("parking state 'forgiven' must list workers it holds parked or back for a re-probe")
        schedule.forgiven = set(forgiven)
        return schedule

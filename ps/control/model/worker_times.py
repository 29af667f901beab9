"""Every worker's observations as the model and auto policies keep them: the first WARMUP after it
joins are left out, and a worker's times since it got its batch are what a plan is measured balanced
on. Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ps.control.model.observations import Observations

WARMUP = 2
"""Each worker's first observations after it joins are not fitted: they hold its first steps'
allocations and caches, not its speed."""


SHORTEST_MS = 1e-3
"""A time is kept as at least this (a microsecond): a step measured at 0 ms (within the clock's
resolution, or a server's cycle that closed as it opened) is no law's time, and a law of zero time
would divide every time tested against it by zero."""
LONGEST_MS = 1e9
"""... and as at most this (11 days): the fits square and sum times, which a float holds only so far
(a time of 1e200 ms overflowed them)."""


class WorkerTimes:
    """Every worker's observations and the warm-up steps it still has to skip."""

    def __init__(self, min_samples: int) -> None:
        self.min_samples = min_samples
        self.obs: dict[str, Observations] = {}
        self.warmup: dict[str, int] = {}
        # called before a worker's fitted times jump (a change forgets its older times, a drift
        # rescales them): the rounds closed until then take their overhead against the fits before it
        self.before_jump: Callable[[], None] = _nothing

    def add(self, worker_id: str) -> None:
        self.obs[worker_id], self.warmup[worker_id] = Observations(), WARMUP

    def remove(self, worker_id: str) -> None:
        self.obs.pop(worker_id, None)
        self.warmup.pop(worker_id, None)

    def record(self, worker_id: str, batch: int, ms: float, exposed: float | None) -> bool:
        """Take one time (False: a warm-up step, left out)."""
        if self.warmup[worker_id] > 0:
            self.warmup[worker_id] -= 1
            return False
        ms = min(max(ms, SHORTEST_MS), LONGEST_MS)
        self.obs[worker_id].add(batch, ms, None if exposed is None else min(exposed, LONGEST_MS))
        return True

    def recent(self, worker_id: str, batch: int, least: int | None = None) -> list[float] | None:
        """The worker's finish times since it got `batch` (at least `least`, `min_samples` unless
        given; None: fewer)."""
        obs = self.obs[worker_id]
        return obs.recent(batch, max(self.min_samples if least is None else least, obs.run(batch)))

    def in_force(self, plan: Mapping[str, int], least: int | None = None) -> dict[str, Sequence[float]] | None:
        """Each planned worker's times since it got its batch in `plan` (None: one has fewer than
        `least`, `min_samples` unless given), read-only until the next observation
        (Observations.since)."""
        least = self.min_samples if least is None else least
        out: dict[str, Sequence[float]] = {}
        obs = self.obs
        for k, b in plan.items():
            if b > 0:  # `recent` refuses a run of none, which a `least` below 1 may ask for
                recent = obs[k].since(b, least) if least >= 1 else self.recent(k, b, least)
                if recent is None:
                    return None
                out[k] = recent
        return out


def _nothing() -> None:
    """No rounds to settle (`WorkerTimes.before_jump` where no policy set one)."""

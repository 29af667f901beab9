"""Who is in the job: active workers, workers waiting to join at a round boundary, and the departed.

Pure bookkeeping with the clock passed in, so liveness rules are testable without sleeping.
"""

from __future__ import annotations

import asyncio
import math
import secrets
from dataclasses import dataclass, field

from common.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, ServiceError
from ps.rounds.rejoins import Rejoins
from ps.rounds.ssp import EpochCounts

MAX_NAME = 128
MAX_CORES = 1e6
MAX_DEPARTED = 10_000


@dataclass
class Member:
    """A joined worker and its counters."""

    worker_id: str
    name: str
    cores: float
    index: int
    last_seen: float
    updates: int = 0
    staleness_sum: int = 0
    epoch_updates: int = 0
    epoch_compute_ms: list[float] = field(default_factory=list)
    epoch_exposed_ms: list[float] = field(default_factory=list)  # BSP pushes that said it (> 0)
    epoch_data_wait_ms: list[float] = field(default_factory=list)  # every push's wait for its batch (part of compute)
    asp: EpochCounts = field(default_factory=EpochCounts)  # ASP: this epoch's staleness and SSP waits
    cuda_device: str | None = None  # the UUID of the GPU it computes on ("" unknown), None on a CPU
    switch_paths: bool = False  # it can follow --allreduce auto's trial (ps.rounds.path_trial)
    max_batch: int | None = None  # the most samples its memory holds (None: no bound of its own)
    told: dict[int, set[int]] = field(default_factory=dict)  # step (BSP round, ASP version) -> batch sizes told for it
    activated: asyncio.Event = field(default_factory=asyncio.Event)
    pushed_at: float | None = None  # when its last push arrived whole, or it became active (ps.rounds.deadlines)
    turned_away: str = ""  # why it was removed before its Join was answered
    warmup: bool = False  # its first round has the warm-up bound: its name's first entry (ps.rounds.rejoins)
    pulled: bool = False  # a Pull was answered since its Join: its first push may follow (ps.rounds.push_checks)

    def seen(self, now: float) -> None:
        """A call from this worker (a heartbeat, a pull, a push)."""
        self.last_seen = now

    def answered_pull(self) -> None:
        """A Pull was answered: it holds the parameters and its samples, and may push (ps.rounds.push_checks)."""
        self.pulled = True

    def pushed(self, now: float) -> None:
        """A push arrived whole, or the worker became active (its first push is due from now)."""
        self.last_seen = self.pushed_at = now

    def count_push(self, ms: float | None, exposed_ms: float, data_wait_ms: float) -> None:
        """One more update, with its compute, exposed (> 0: measured) and data-wait times this epoch."""
        self.epoch_data_wait_ms.append(data_wait_ms)
        self.updates += 1
        self.epoch_updates += 1
        if ms is not None:
            self.epoch_compute_ms.append(ms)
        if exposed_ms > 0:
            self.epoch_exposed_ms.append(exposed_ms)

    def count_staleness(self, staleness: int, clock_staleness: int) -> None:
        """ASP: an update `staleness` versions old was applied, `clock_staleness` ahead of the slowest (ps.rounds.ssp)."""
        self.staleness_sum += staleness
        self.asp.update(staleness, clock_staleness)

    def new_epoch(self) -> None:
        """The per-epoch counters start again."""
        self.epoch_updates = 0
        self.epoch_compute_ms = []
        self.epoch_exposed_ms = []
        self.epoch_data_wait_ms = []
        self.asp = EpochCounts()

    def enter(self, warmup: bool) -> None:
        """It enters the job (active); `warmup`: its first round has the warm-up bound."""
        self.warmup = warmup

    def turn_away(self, why: str) -> None:
        """Removed before its Join was answered: the Join hears `why`."""
        self.turned_away = why

    def tell(self, step: int, batch: int, keep_after: int | None = None, keep_last: int = 4) -> None:
        """Record that a reply told this worker `batch` for `step`. Forget the steps before `keep_after`
        (BSP: the round before the open one), or all but the newest `keep_last` steps (ASP)."""
        self.told.setdefault(step, set()).add(batch)
        for old in list(self.told):
            if (old < keep_after) if keep_after is not None else len(self.told) > keep_last:
                del self.told[old]


class Membership:
    """Active and pending members keyed by worker id; names are unique among them. What a name's earlier
    joins earn its next one (its warm-up, its backoff) is `names`'."""

    def __init__(self, max_workers: int, names: Rejoins | None = None) -> None:
        self.max_workers = max_workers
        self.active: dict[str, Member] = {}
        self.pending: dict[str, Member] = {}
        self.departed: dict[str, str] = {}  # worker id -> why it went ("left", "evicted after ...")
        self.departed_updates: dict[str, int] = {}  # name -> the updates its departed members made
        self.names = names or Rejoins()
        self._joined = 0

    def admit(self, name: str, cores: float, now: float, cuda_device: str | None = None, max_batch: int | None = None,
              switch_paths: bool = False) -> Member:
        """Validate a join and add the worker as pending (what it declared: Member's fields)."""
        self.check_join(name, cores, now)
        member = Member(f"{name}-{secrets.token_hex(4)}", name, cores, self._joined, now, cuda_device=cuda_device,
                        switch_paths=switch_paths, max_batch=max_batch)
        self._joined += 1
        self.pending[member.worker_id] = member
        return member

    def check_join(self, name: str, cores: float, now: float) -> None:
        """Raise what `admit` would refuse at `now`, changing nothing."""
        if not name or len(name) > MAX_NAME:
            raise InvalidArgument(f"name must be 1-{MAX_NAME} characters")
        if not name.isprintable():  # it goes into the server's progress lines and logs as it is
            raise InvalidArgument(f"name must be printable (no control characters), got {name!r:.160}")
        if name != name.strip():  # " a" and "a" would be two workers that print alike
            raise InvalidArgument(f"name must not begin or end with whitespace, got {name!r:.160}")
        if not (math.isfinite(cores) and 0 < cores <= MAX_CORES):
            raise InvalidArgument(f"cores must be a finite number in (0, {MAX_CORES:.0f}], got {cores}")
        if len(self.active) + len(self.pending) >= self.max_workers:
            raise FailedPrecondition(f"job full: {self.max_workers} workers are in the job (--max-workers)")
        if any(m.name == name for m in self.members()):
            raise AlreadyExists(f"a worker named {name!r} is already in the job; pick another --name or wait for its eviction")
        self.names.check(name, now)

    def activate(self, worker_id: str) -> Member:
        member = self.pending.pop(worker_id)
        self.active[worker_id] = member
        member.enter(self.names.entered(member.name))
        return member

    def members(self) -> list[Member]:
        return [*self.active.values(), *self.pending.values()]

    def update_counts(self) -> dict[str, int]:
        """The updates each name's pushes made in this run: the active members' and the departed ones'
        (a worker that left, or left and rejoined, trained too)."""
        counts = dict(self.departed_updates)
        for m in self.active.values():
            counts[m.name] = counts.get(m.name, 0) + m.updates
        return counts

    def get(self, worker_id: str) -> Member:
        """An active member; departed ones are told to rejoin, unknown ones to join."""
        member = self.active.get(worker_id)
        if member is not None:
            return member
        if worker_id in self.pending:
            raise FailedPrecondition(
                f"worker {worker_id!r} is waiting to be admitted: the job has not started or the round it joins at is open"
            )
        raise self.gone(worker_id)

    def gone(self, worker_id: str) -> ServiceError:
        """What a call as `worker_id`, not a member, hears: evicted ones to rejoin, the others to join."""
        reason = self.departed.get(worker_id)
        if reason is not None and reason.startswith("evicted"):
            return FailedPrecondition(f"worker {worker_id!r} was {reason}; rejoin")
        if reason is not None:
            return NotFound(f"worker {worker_id!r} {reason}; Join again")
        return NotFound(f"unknown worker id {worker_id!r}; Join first")

    def known(self, worker_id: str) -> bool:
        """Whether the id is a member's, pending or active, or a departed one's."""
        return worker_id in self.active or worker_id in self.pending or worker_id in self.departed

    def stale(self, now: float, timeout: float) -> list[Member]:
        """Active members not heard from for more than `timeout` seconds."""
        return [m for m in self.active.values() if now - m.last_seen > timeout]

    def remove(self, worker_id: str, reason: str, now: float) -> Member:
        """`worker_id` goes for `reason` at `now`; an active member without a push since it joined is a
        strike against its name (ps.rounds.rejoins)."""
        member = self.active.pop(worker_id, None)
        if member is not None:
            self.names.departed(member.name, member.updates > 0, now)
            if member.updates:
                if member.name not in self.departed_updates and len(self.departed_updates) >= MAX_DEPARTED:
                    self.departed_updates.pop(next(iter(self.departed_updates)))
                self.departed_updates[member.name] = self.departed_updates.get(member.name, 0) + member.updates
        else:
            member = self.pending.pop(worker_id)
        if len(self.departed) >= MAX_DEPARTED:
            self.departed.pop(next(iter(self.departed)))
        self.departed[worker_id] = reason
        return member

"""Probation (BSP, on every path): a newcomer to a running job proves that it computes before any round
waits for it.

A member that enters after the job's start (at a round boundary, ps.rounds.admission) while some
member is planned, and whose name has not had a push taken in this job (ps.rounds.rejoins), is on
probation: the batch policy does not plan it, so no round waits for it, Σb = B holds over the others
and no slice of the epoch is handed to it; on the --allreduce fast path it holds no rank in the
workers' group either (ps.rounds.fast_path), so the group does not re-form for it. Its replies ask it
for one probe step at the open round (`probe` in the header, with no group and no snapshot asked): a
batch of its share of B by declared cores (within its own max batch and the server's bounds, whole
micro-batches, at least one), with --sampling exact the probe slice, the first samples of the open
epoch's permutation, which no epoch counts.

A probe travels the PS path whatever the job's: the whole gradient (with --shards every range, not
only this server's) in one push of kind values to this server, so neither a shard nor the group sees a
probationer. It is checked as any push (complete, finite, the norm bounds) for the round it was told
(the open one or an earlier one: a probe may take longer than a round), then neither applied nor
counted; its compute time is the policy's first measurement of the worker. The push's reply waits for
the round boundary at which the member enters the plan (the re-split a join takes, and on the fast
path the group's next generation, with the member in it), and tells it its round, batch and group
from there: what a worker's reply to any push says. From that reply on the worker follows the job's
path (its shards, its group).

A probationer that never pushes holds no round: its push stream ends at the transport's limits, and
the heartbeat timeout evicts it, or, if it goes on heartbeating, the warm-up bound (--round-warmup)
after it was asked for its probe (ps.rounds.deadlines), so that it holds a place among --max-workers
no longer; its name's rejoins back off as after any departure without a push.
If the last planned member goes, a probationer whose probe is in enters the plan at once, and one
whose probe is not in enters when it arrives (the open round starts afresh with them: nobody else
trains), never before: it was told the probe's batch for the open round. Not under ASP: there a
newcomer enters at once (ps.rounds.admission)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from common.errors import FailedPrecondition, InvalidArgument
from common.transport.messages import PushMeta, SliceRange
from ps.rounds.membership import Member
from ps.rounds.state import JobState


@dataclass
class Probe:
    """A probationer's probe: the batch it is asked for, whether its push arrived and what it took, and
    the event its push's reply waits on (set when it enters the plan, leaves, or the job ends)."""

    batch: int
    since: float = 0.0  # when it was asked for (the job's clock)
    pushed: bool = False
    compute_ms: float | None = None  # the time the policy balances (None: not measured)
    exposed_ms: float = 0.0
    entered: asyncio.Event = field(default_factory=asyncio.Event)

    def took(self, compute_ms: float | None, exposed_ms: float) -> None:
        """Its push arrived whole and checked, having taken `compute_ms` (None: not measured)."""
        self.pushed, self.compute_ms, self.exposed_ms = True, compute_ms, exposed_ms


def probe_batch(global_batch: int, cores: float, planned_cores: float, low: int, high: int, micro: int) -> int:
    """The probe's batch: the share of `global_batch` that `cores` would have beside `planned_cores`, in
    whole `micro`-batches within [low, high] (high wins), at least one micro-batch."""
    share = global_batch * cores / (cores + planned_cores) if cores + planned_cores > 0 else global_batch
    units = max(1, round(share / micro), -(-low // micro))
    return max(micro, min(units * micro, high // micro * micro))


class Probation:
    """The members on probation and their probes."""

    def __init__(self, state: JobState, samples: int) -> None:
        """`samples`: the training set's (a probe slice is at most one epoch's)."""
        self.state = state
        self.samples = samples
        self.probes: dict[str, Probe] = {}  # worker id -> its probe
        self.proven = 0  # probes taken

    def path_allows(self) -> bool:
        """Whether the job takes probation: BSP, on every path (the PS path, --shards, --allreduce: a probe
        travels to this server whole whatever the path)."""
        return self.state.spec.mode == "bsp"

    def available(self) -> bool:
        """Whether a member entering now may be put on probation: the path takes it, and a planned member
        trains meanwhile."""
        return self.path_allows() and bool(self.state.planned())

    def on(self, member: Member) -> bool:
        return member.worker_id in self.probes

    def begin(self, member: Member, max_batch: int | None) -> None:
        """`member` enters on probation (its first round has no warm-up bound: it holds none)."""
        s = self.state
        cfg = s.policy.config
        plan = s.policy.plan()
        planned_cores = sum(m.cores for m in s.members.values() if m.name in plan)
        high = min(cfg.default_max_batch, max_batch or cfg.default_max_batch, s.spec.global_batch, self.samples)
        batch = probe_batch(s.spec.global_batch, member.cores, planned_cores, max(cfg.min_batch, 1), high,
                            s.spec.micro_batch)
        self.probes[member.worker_id] = Probe(batch, s.clock())
        member.enter(False)
        s.metrics.write("probation", worker=member.name, probe_batch=batch, step=s.step, epoch=s.epoch)

    def batch(self, member: Member, planned: int) -> int:
        """The batch a reply tells `member`: its probe's on probation, else `planned`."""
        probe = self.probes.get(member.worker_id)
        return planned if probe is None else probe.batch

    def probe_step(self, member: Member, exact: bool) -> tuple[int, tuple[SliceRange, ...], tuple[SliceRange, ...]]:
        """What a reply tells `member` on probation: its probe's batch, with `exact` (--sampling exact)
        its probe slice, the first samples of the open epoch's permutation (no epoch counts them), and
        nothing ahead."""
        batch = self.probes[member.worker_id].batch
        return batch, (SliceRange(self.state.epoch, 0, batch),) if exact else (), ()

    def check_kind(self, member: Member, meta: PushMeta) -> None:
        """A probationer's push is its probe's gradient (kind values) on every path: a report or a
        snapshot carries no computation to prove."""
        if meta.kind != "values":
            raise InvalidArgument(f"worker {member.name} is on probation: its push is its probe's whole gradient "
                                  f"(kind values, on every path), not a {meta.kind}")

    def check(self, member: Member, meta: PushMeta) -> None:
        """A probe comes once, for a round that opened (any: it is not applied, and a probe may take
        many rounds); its batch is the one told for that round (PushChecks.told)."""
        s = self.state
        probe = self.probes[member.worker_id]
        if probe.pushed:
            raise FailedPrecondition(f"worker {member.name} already pushed its probe; it enters the plan at the "
                                     "round's close")
        if not 0 <= meta.round <= s.round:
            raise FailedPrecondition(f"round {meta.round} is not open; the open round is {s.round}")

    def took(self, member: Member, compute_ms: float | None, exposed_ms: float) -> asyncio.Event:
        """`member`'s checked probe push: note what it took; the event set once it entered the plan (or
        left, or the job ended)."""
        s = self.state
        probe = self.probes[member.worker_id]
        probe.took(compute_ms, exposed_ms)
        self.proven += 1
        s.membership.names.proved(member.name)
        s.metrics.write("probe", worker=member.name, batch=probe.batch, step=s.step, epoch=s.epoch,
                        compute_ms=None if compute_ms is None else round(compute_ms, 3))
        return probe.entered

    def entering(self, everyone: bool = False) -> list[tuple[Member, Probe]]:
        """The probationers that enter the plan now (their probe is in; `everyone`: all of them, the path
        having left probation behind), off probation. One whose probe is not in never enters in the
        middle of a round it was told its probe for: its push of the probe's batch would count there."""
        s = self.state
        leaving = [(s.members[w], p) for w, p in self.probes.items()
                   if w in s.members and (everyone or p.pushed)]
        for member, _ in leaving:
            del self.probes[member.worker_id]
        return leaving

    def overdue(self, now: float, bound_s: float) -> list[Member]:
        """The probationers whose probe push has not arrived `bound_s` seconds after they were asked for it."""
        s = self.state
        return [s.members[w] for w, p in self.probes.items()
                if w in s.members and not p.pushed and now - p.since > bound_s]

    def removed(self, member: Member) -> None:
        """`member` left or was evicted (RoundEvents.member_removed): its probe's reply goes."""
        probe = self.probes.pop(member.worker_id, None)
        if probe is not None:
            probe.entered.set()

    def ended(self, reason: str) -> None:
        """The job is done: the probes' replies go (they say so)."""
        for probe in self.probes.values():
            probe.entered.set()

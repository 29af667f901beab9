"""ASP updates: a push is the update Δ a worker's own optimizer produced (worker/paths/local_optimizer.py)
from the parameter version it names, at most --max-staleness versions old; the server applies it at
once (θ ← θ + f·Δ, f the --staleness-lr factor), one version more, and counts its staleness. With
--staleness-bound the reply waits while its worker is too far ahead of the slowest (ps/rounds/ssp.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from common.errors import FailedPrecondition
from common.job.spec import STALENESS_LR
from common.params.aggregation import asp_lr
from ps.rounds.epochs import Epochs
from ps.rounds.membership import Member
from ps.rounds.ssp import WorkerClocks
from ps.rounds.state import JobState
from common.transport.chunked import Vector
from common.transport.magnitude import magnitude_of
from common.transport.messages import PushMeta


@dataclass(frozen=True)
class AspSettings:
    """The server's ASP flags: --max-staleness (refuse), --staleness-bound (wait), --staleness-lr."""

    max_staleness: int | None = None
    staleness_bound: int | None = None
    staleness_lr: str = "off"

    def __post_init__(self) -> None:
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError(f"--max-staleness must be >= 0, got {self.max_staleness}")
        if self.staleness_bound is not None and self.staleness_bound < 0:
            raise ValueError(f"--staleness-bound must be >= 0, got {self.staleness_bound}")
        if self.staleness_lr not in STALENESS_LR:
            raise ValueError(f"--staleness-lr must be one of {', '.join(STALENESS_LR)}, got {self.staleness_lr!r}")


def staleness_factor(rule: str, staleness: int, running: int) -> float:
    """The factor --staleness-lr `rule` applies to an update `staleness` versions old, with `running`
    workers (common.job.spec.STALENESS_LR)."""
    if rule == "inverse":
        return 1.0 / max(1, staleness)
    if rule == "excess":
        return min(1.0, max(1, running - 1) / staleness) if staleness else 1.0
    return 1.0


class AspUpdates:
    """The staleness checks, the update rule and the SSP gate's held replies."""

    def __init__(self, state: JobState, epochs: Epochs, settings: AspSettings) -> None:
        self.state = state
        self.epochs = epochs
        self.settings = settings
        self.max_staleness = settings.max_staleness
        self.clocks = WorkerClocks(settings.staleness_bound)
        self.held: dict[str, asyncio.Future[None]] = {}  # worker id -> its reply, waiting for the slowest

    def check_version(self, meta: PushMeta) -> None:
        """The push's version is one the server has had, and not too old."""
        version = self.state.version
        if meta.version > version or meta.version < 0:
            raise FailedPrecondition(f"version {meta.version} is unknown; the current version is {version}")
        if self.max_staleness is not None and version - meta.version > self.max_staleness:
            raise FailedPrecondition(
                f"version {meta.version} is {version - meta.version} versions old, over the limit "
                f"{self.max_staleness}; pull and recompute"
            )

    def check_not_held(self, member: Member) -> None:
        """One held reply per worker: a push while SSP still holds the reply to its last is refused (and
        the held one goes on waiting, to be answered)."""
        if member.worker_id in self.held:
            raise FailedPrecondition(f"worker {member.name}'s previous push still waits for its reply "
                                     "(--staleness-bound); one push at a time")

    def lr(self, batch: int, global_batch: int) -> float:
        """The learning rate told to a worker planned `batch` of `global_batch`: η_k = η·b_k/B at the
        schedule's epoch (Eq. 5b; η with --no-lr-scaling), 0 for a parked worker (batch 0)."""
        s = self.state
        return asp_lr(s.spec.lr_at(s.epoch), batch, global_batch, s.spec.lr_scaling) if batch else 0.0

    def running(self) -> list[str]:
        """The workers SSP counts: active and planned a batch (a parked worker, at 0, holds nobody back)."""
        plan = self.state.policy.plan()
        return [worker_id for worker_id, m in self.state.members.items() if plan.get(m.name, 0) > 0]

    def apply(self, member: Member, meta: PushMeta, delta: Vector) -> None:
        """θ ← θ + f·Δ (checked by the push checks: it cannot refuse now, f <= 1); the batch policy
        observes the worker's time; one version more; the update's staleness counted."""
        s = self.state
        staleness = s.version - meta.version
        self.clocks.sync(self.running())
        factor = staleness_factor(self.settings.staleness_lr, staleness, len(self.clocks.clocks))
        s.store.apply_update(delta, magnitude_of(delta) * factor, scale=factor)
        s.policy_calls.observe(member.name, meta.batch_size, meta.times.compute_ms)
        member.count_staleness(staleness, self.clocks.tick(member.worker_id))
        self.epochs.count_push(member, meta.times.compute_ms, meta.batch_size, data_wait_ms=meta.times.data_wait_ms)
        s.next_version()

    async def wait_turn(self, member: Member) -> None:
        """Release the replies the last change let go; hold this one while SSP holds its worker back
        (until the slowest catches up, leaves, is evicted or parked, or the job ends)."""
        self.release()
        worker_id = member.worker_id
        if self.clocks.held(worker_id) and not self.state.done:
            assert worker_id not in self.held, "check_not_held refuses a second push before it is applied"
            future = asyncio.get_running_loop().create_future()
            self.held[worker_id] = future
            started = self.state.clock()
            try:
                await future
            finally:
                self.held.pop(worker_id, None)
            member.asp.waited(self.state.clock() - started)
        self.clocks.read(worker_id)

    def release(self) -> None:
        """Let go of every held reply whose worker SSP no longer holds back (all once the job is done)."""
        self.clocks.sync(self.running())
        for worker_id, future in list(self.held.items()):
            if (self.state.done or not self.clocks.held(worker_id)) and not future.done():
                future.set_result(None)

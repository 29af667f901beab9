"""The open BSP round: who pushed, the batch-weighted sum of their gradients (with --allreduce: the
samples they reported, the workers having stepped themselves), the future every push of the round
waits on, and when the last round's replies went out (--balance cycle times a worker's cycle from
there). The coordinator closes the round once every member the plan gives a batch pushed (a parked
worker is not waited for: parking.py), then steps and opens the next; the batch policy is told how
long each round took, close to close."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from common.errors import FailedPrecondition
from common.params.aggregation import WeightedMean
from ps.rounds.events import Event
from ps.rounds.membership import Member
from ps.rounds.parking import Parking
from ps.rounds.state import JobState
from common.transport.chunked import Vector
from common.transport.messages import PushMeta


class BspRound:
    """The open round's state; a new round starts from `next_round`."""

    def __init__(self, state: JobState, parking: Parking) -> None:
        self.state = state
        self.parking = parking
        self.accumulator: WeightedMean | None = None  # the round's sum (None with --allreduce, and on ASP jobs)
        self.round_batch = 0  # allreduce: samples reported in the open round
        self.follow_path()
        self.contributions: dict[str, int] = {}  # --shards: batch per worker in the open round
        self.pushed: set[str] = set()
        self.future: asyncio.Future[bool] | None = None
        self.replies_sent_at: float | None = None  # --balance cycle: when the open round's replies went out
        self.replied: set[str] = set()  # --balance cycle: the workers they went to (who pushed the last round)
        self.closed_at: float | None = None  # when the last round closed (the policy's round time)
        self.cpu_at = time.thread_time()  # the event loop's CPU time then (the policy's time a push)
        self.committing = False  # --shards: the round's commit is under way
        self.commit_task: asyncio.Task[None] | None = None  # held: the loop keeps only weak references
        self.summed: Event[[Vector | None]] = Event()  # the round's mean before its step (allreduce: None)

    def follow_path(self) -> None:
        """Sum the round's gradients here unless the job's path is the fast path (the workers sum
        them themselves) or it is ASP; at the start, and when --allreduce auto switches the path
        between rounds."""
        spec = self.state.spec
        self.accumulator = (WeightedMean(self.state.own_numel, scale=spec.global_batch)
                            if spec.mode == "bsp" and not spec.allreduce else None)
        self.round_batch = 0

    def check_open(self, member: Member, meta: PushMeta) -> None:
        """A push is for the open round, once per worker (not while --shards commits the last one)."""
        if meta.round != self.state.round or self.committing:
            raise FailedPrecondition(f"round {meta.round} is not open; the open round is {self.state.round}")
        if member.worker_id in self.pushed:
            raise FailedPrecondition(f"worker {member.name} already pushed for round {self.state.round}")

    def balanced_ms(self, member: Member, meta: PushMeta) -> float | None:
        """The time the batch policy balances for this BSP push (PushTimes.balanced_ms). The cycle is the
        server's own measure, from the round's replies going out to this push fully arrived; None
        (nothing observed) for a worker that did not push the previous round (its cycle began with a
        join or a pull, not with this round's reply)."""
        cycle_ms = None
        if member.worker_id in self.replied and self.replies_sent_at is not None:
            cycle_ms = max(0.0, (self.state.clock() - self.replies_sent_at) * 1000.0)
        return meta.times.balanced_ms(self.state.spec.balance, cycle_ms)

    def add(self, member: Member, meta: PushMeta, grad: Vector) -> None:
        """Take a push's gradient into the round's sum (allreduce: count its samples)."""
        if self.accumulator is not None:
            self.accumulator.add(grad, meta.batch_size)
            self.contributions[member.worker_id] = meta.batch_size
        else:  # allreduce: the workers applied the step themselves
            self.round_batch += meta.batch_size

    def mark_pushed(self, member: Member) -> asyncio.Future[bool]:
        """Note the push; the future that resolves when the round closes."""
        self.pushed.add(member.worker_id)
        if self.future is None:
            self.future = asyncio.get_running_loop().create_future()
        return self.future

    def all_pushed(self) -> bool:
        """Every active member the plan gives a batch pushed for the open round."""
        return self.pushed >= self.parking.required()

    def pushes(self) -> int:
        """How many pushes (allreduce: samples reported) the open round holds."""
        return self.accumulator.count if self.accumulator is not None else self.round_batch

    def step_store(self) -> int:
        """Close the round's sum into the store's step (begun; it is applied a piece at a time as the
        replies stream the new values); the round's samples. Allreduce: nothing to apply."""
        if self.accumulator is not None:
            # stepped piece by piece as the replies stream the new values (common.params.store, common.transport.payload);
            # the accumulator's sum is not reused before begin_push settles the step
            mean = self.accumulator.result()
            self.summed.emit(mean)
            self.state.store.begin_step(mean, self.accumulator.bound)
            batch = self.accumulator.weight
            self.accumulator.reset()
        else:  # allreduce: nothing to apply; the parameters arrive with the hub's snapshots
            batch, self.round_batch = self.round_batch, 0
            self.summed.emit(None)
        return batch

    def commit_in_background(self, commit: Callable[[], Awaitable[None]]) -> None:
        """--shards: run the round's `commit` as a task, once (a close while it runs changes nothing);
        no push is for the open round until it ended, and then its pushes are answered, however it ended."""
        if not self.committing:
            self.committing = True
            self.commit_task = asyncio.get_running_loop().create_task(self._commit(commit))

    async def _commit(self, commit: Callable[[], Awaitable[None]]) -> None:
        try:
            await commit()
        finally:
            self.committing = False
            self.resolve()

    async def commit_shards(self, wait_s: float) -> int:
        """--shards: step every range at once (the shards' in their processes, range 0 here) with the
        round's sum; the round's samples. A shard that did not get every push says which it missed."""
        s = self.state
        accumulator = self.accumulator
        assert s.shards is not None and accumulator is not None
        commit = asyncio.ensure_future(s.shards.commit(s.round, dict(self.contributions), s.store.lr, wait_s=wait_s))
        s.store.apply_gradient(accumulator.result(), accumulator.bound)
        batch = accumulator.weight
        accumulator.reset()
        acks = await commit
        if any(ack.missing for ack in acks):
            s.metrics.write("shard_missing", step=s.step, missing=sorted({w for a in acks for w in a.missing}))
        return batch

    def next_round(self) -> None:
        """The open round's pushers become the last round's repliers; nobody has pushed the next. The
        policy hears how long the round took since the one before closed, and the CPU over it of the
        event loop it runs on (this thread), per push: the pushes queue for that loop, which takes each
        one's parts, checks and sum, and the round's step and replies (none on the fast path, whose
        gradients never reach the server)."""
        now, cpu = self.state.clock(), time.thread_time()
        if self.closed_at is not None:
            pushes = len(self.pushed) if self.accumulator is not None else 0
            push_ms = (cpu - self.cpu_at) * 1000.0 / pushes if pushes else 0.0
            self.state.policy_calls.observe_round(max(0.0, (now - self.closed_at) * 1000.0), max(0.0, push_ms))
        self.closed_at, self.cpu_at = now, cpu
        self.replied = set(self.pushed)
        self.pushed.clear()
        self.contributions.clear()

    def resolve(self) -> None:
        """The round closed (or the job stopped): wake its pushes; their replies go out now."""
        self.replies_sent_at = self.state.clock()
        future, self.future = self.future, None
        if future is not None and not future.done():
            future.set_result(True)
        self.parking.wake()

    def forget(self, member: Member) -> None:
        """`member` left or was evicted: the round no longer counts its push as one it waits on."""
        self.pushed.discard(member.worker_id)

    def abort(self) -> None:
        """Drop the open round's partial sum (the job stops)."""
        if self.accumulator is not None:
            self.accumulator.reset()
        self.round_batch = 0
        self.pushed.clear()

"""The server's core, the one object the servicer talks to, in plain Python values (no gRPC): it runs
join, push, pull, leave and heartbeat through the concerns of ps/rounds, each with its own state.

The batch sizes come from the batch policy (ps/control): the coordinator tells it who joined and left
and what each push took, and asks it for the plan. Every method validates before it mutates, so a
refused request (a ServiceError) leaves the parameters, the round and the batch policy as they were.
The batch policy is keyed by worker name, so a worker that rejoins (after an eviction or a server
restart) under its name finds its place in the plan again. The concerns it runs through, built and
wired to the round events, are parts.py's.
"""

from __future__ import annotations

import asyncio
from typing import Any

from common.errors import FailedPrecondition, InvalidArgument
from ps.rounds.fast_path import with_optimizer_state
from ps.rounds.membership import Member
from ps.rounds.parts import CoordinatorParts
from ps.rounds.reports import status, summary
from common.transport.chunked import Vector
from common.transport.messages import (MAX_LEAVE_REASON, Beat, JobStatus, JoinAsk, JoinInfo, PushMeta, StepReply, StoreAnswer,
                                       StoreCall)
from common.transport.wire import ChunkReceiver


class Coordinator(CoordinatorParts):
    """Owns the job's state; one instance per server, driven from one asyncio event loop. Its concerns
    and their wiring are CoordinatorParts' (parts.py)."""

    # ----------------------------------------------------------------- membership
    async def join(self, ask: JoinAsk) -> JoinInfo:
        """Admit a worker. Before the start it waits for all expected workers; later it
        enters at the next round boundary (BSP) or at once (ASP) and gets a share of B. Its dataset is
        checked by Sampling; `ask.switch_paths`: it can follow --allreduce auto's trial (ps.rounds.path_trial)."""
        max_batch = ask.max_batch or None  # None: no bound of its own
        try:
            self.admission.check(ask.name, ask.cores, ask.cuda_device, max_batch)
            self.sampling.check_join(ask.dataset_length, ask.dataset_fingerprint)
        except FailedPrecondition as exc:
            self.admission.refused(ask.name, exc)
            raise
        try:
            member = await self.admission.admit(ask.name, ask.cores, ask.cuda_device, max_batch, ask.switch_paths)
        except BaseException:
            self.sampling.withdraw(ask.dataset_fingerprint)
            raise
        member.seen(self.clock())
        plan = self.policy.plan()
        batch = self.probation.batch(member, plan.get(member.name, 0))  # on probation: its probe's
        self.replies.tell(member, batch)
        return JoinInfo(
            member.worker_id, member.index, batch, self.round, self.version, self.epoch,
            self.spec.to_json(), self.layout, self.heartbeat_interval, self.replies.group(member, plan),
            tuple(self.shards.info()) if self.shards else (), self.keys.secret(member.worker_id), sum(plan.values()),
        )

    def member(self, worker_id: str, secret: str) -> Member:
        """The active member a call names, once it proved to be that worker (ps.serving.worker_keys).
        An id the server never issued (or has forgotten: a restart) is NOT_FOUND whatever the secret; a
        known one is checked before its state is told (pending, departed: FAILED_PRECONDITION / NOT_FOUND)."""
        if self.membership.known(worker_id):
            self.keys.check(worker_id, secret)
        return self.membership.get(worker_id)

    async def leave(self, worker_id: str, secret: str, reason: str = "") -> None:
        """Remove a worker; a BSP round that only waited on it closes with the others. `reason`, the
        worker's own word on why (LeaveRequest.reason), goes into the leave record and changes nothing
        else; InvalidArgument, the worker kept, for one over MAX_LEAVE_REASON characters or not printable."""
        self.member(worker_id, secret)
        if len(reason) > MAX_LEAVE_REASON or not reason.isprintable():
            raise InvalidArgument(f"a Leave's reason must be at most {MAX_LEAVE_REASON} printable characters")
        self.departures.remove(worker_id, "leave", "left", said=reason)

    def heartbeat(self, worker_id: str, secret: str) -> Beat:
        self.member(worker_id, secret).seen(self.clock())
        return Beat(self.done, self.epoch, self.round, self.version)

    async def rendezvous_call(self, worker_id: str, secret: str, call: StoreCall) -> StoreAnswer:
        """--allreduce: a member's call on its group generation's store (FastPath.store_call)."""
        self.member(worker_id, secret)
        return await self.fast_path.store_call(worker_id, call)

    def evict_stale(self) -> list[str]:
        """Evict workers silent for longer than evict_after; returns their names."""
        return self.departures.evict_stale()

    async def reap_forever(self, interval: float) -> None:
        """Background task: evict silent workers, and members past a deadline (ps.rounds.deadlines), until the job ends."""
        while not self.done:
            await asyncio.sleep(interval)
            self.evict_stale()
            self.deadlines.check()

    # ---------------------------------------------------------------------- push
    def begin_push(self, meta: PushMeta) -> ChunkReceiver:
        """Validate a push header and hand back a receiver for its payload."""
        self.store.settle()  # a deferred step may still read the accumulator's sum
        member = self.member(meta.worker_id, meta.secret)
        return self.checks.header(member, meta)

    async def push(self, meta: PushMeta, values: Vector) -> StepReply:
        """Apply a validated push; BSP returns once the round closes (a probe: once its worker entered
        the plan), ASP at once."""
        member = self.member(meta.worker_id, meta.secret)
        if meta.kind == "snapshot":
            self.checks.snapshot(member, meta)
            member.seen(self.clock())
            self.whole_model.load_snapshot(values)  # and what waited for it (ps.rounds.path_trial's switch back)
            return self.replies.reply(member)
        self.checks.sequence(member, meta)
        self.checks.told(member, meta)
        if not self.done and meta.kind == "values":
            values = self.norms.bound(member, values)  # --max-update-norm, --clip-outliers
            self.checks.values(member, meta, values)
        self.deadlines.pushed(member)
        if self.done:
            return self.replies.reply(member)
        if self.probation.on(member):  # checked, neither applied nor counted (ps.rounds.probation)
            times = meta.times
            entered = self.probation.took(member, self.bsp.balanced_ms(member, meta), times.fitted_exposed_ms(self.spec.balance))
            if not self.planned():  # nobody trains: it enters now, the open round afresh
                self.admission.activate_pending()
            await entered.wait()
            return self.replies.reply(member)
        if self.spec.mode == "bsp":
            await self.round_close.push(member, meta, values)
            return self.replies.reply(member)
        self.asp.apply(member, meta, values)
        self.sampling.pushed(member, meta.batch_size)
        self.milestones.advance(meta.batch_size)
        await self.asp.wait_turn(member)  # --staleness-bound: while its worker is too far ahead
        return self.replies.reply(member)

    # -------------------------------------------------------------- pull / reply
    def pull(self, worker_id: str, secret: str, header_only: bool = False, optimizer_state: bool = False) -> StepReply:
        """The worker's plan with the parameters (`header_only`: without), or with the optimizer's flat
        state instead (`optimizer_state`: an --allreduce worker starting from the server's copy)."""
        member = self.member(worker_id, secret)
        if optimizer_state and self.shards is not None:
            raise InvalidArgument("the optimizer state is pulled from an unsharded server only (--allreduce jobs)")
        member.seen(self.clock())
        if not optimizer_state:
            reply = self.replies.reply(member, params=not header_only)
        else:
            reply = with_optimizer_state(self.replies.reply(member, params=False), self.store.flat_optimizer_state(),
                                         self.payload)
        member.answered_pull()
        return reply

    async def wait_for_batch(self, worker_id: str, secret: str) -> None:
        """A parked worker's long poll (ps.rounds.parking): returns once the plan gives it a batch."""
        await self.parking.wait_for_batch(self.member(worker_id, secret))

    async def load_shards(self) -> None:
        """--shards: hand every shard its range (initial or resumed parameters) before workers join."""
        await self.whole_model.load_shards(self.keys.key)

    # ------------------------------------------------------------- checkpoints
    def restore(self, state: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
        """Load a checkpoint before the job starts (Checkpoints.restore); the batch policy settings that
        differ from the checkpoint's, {field: (checkpoint's, this server's)}: this server's apply."""
        return self.checkpoints.restore(state)

    # ------------------------------------------------------------ end of the job
    def note_reply_sent(self) -> None:
        """Called after a reply is delivered; the job finishes once every worker was told it is done."""
        self.end.check()

    async def wait_finished(self, grace_s: float) -> None:
        """Wait until the job is done and every worker has heard so (or grace_s after done)."""
        await self.end.wait(grace_s)

    def summary(self) -> dict[str, Any]:
        e = self.evaluation
        return {**summary(self, self.epochs.start_time, self.epochs.end_time, e.last_accuracy, e.last_loss,
                          self.epochs.start_samples),
                **self.deadlines.report(), **self.sampling.report(), **self.norms.report()}

    def status(self) -> JobStatus:
        path = "auto" if self.fast_path.undecided else "allreduce" if self.spec.allreduce else "ps"
        why = self.path_trial.why or self.fast_path.why  # --allreduce auto's choice
        return status(self, path, why, self.evaluation.last_accuracy, **self.adaptive.status())

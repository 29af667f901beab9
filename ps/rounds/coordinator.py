"""The server's core, the one object the servicer talks to, in plain Python values (no gRPC): it runs
join, push, pull, leave and heartbeat through the concerns of ps/rounds, each with its own state.

The batch sizes come from the batch policy (ps/control): the coordinator tells it who joined and left
and what each push took, and asks it for the plan. Every method validates before it mutates, so a
refused request (a ServiceError) leaves the parameters, the round and the batch policy as they were.
The batch policy is keyed by worker name, so a worker that rejoins (after an eviction or a server
restart) under its name finds its place in the plan again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import torch

from ps.control.policy import BatchPolicy
from common.errors import InvalidArgument
from common.job.datasets import TrainingData
from ps.rounds.evaluator import BackgroundEvaluator
from common.job.spec import JobSpec
from ps.ops.metrics import MetricsLog
from common.params.norm_clip import NormLimits
from common.params.store import ParameterStore
from ps.rounds.adaptive_batch import AdaptiveBatchSizing, AdaptiveSettings
from ps.rounds.admission import Admission
from ps.rounds.asp import AspSettings, AspUpdates
from ps.rounds.bsp import BspRound
from ps.rounds.checkpoint_state import Checkpoints
from ps.rounds.deadlines import Deadlines, Limits
from ps.rounds.departures import Departures
from ps.rounds.epochs import Epochs
from ps.rounds.evaluations import Evaluations
from ps.rounds.events import RoundEvents
from ps.rounds.fast_path import FastPath, check_paths, with_optimizer_state
from ps.rounds.inflight import PushesInFlight
from ps.rounds.job_end import JobEnd
from ps.rounds.milestones import Milestones
from ps.rounds.membership import Member, Membership
from ps.rounds.parking import Parking
from ps.rounds.path_trial import PathTrial
from ps.rounds.push_checks import PushChecks
from ps.rounds.rendezvous import Rendezvous
from ps.rounds.reports import status, summary
from ps.rounds.round_close import RoundClose
from ps.rounds.sampling import Sampling
from ps.rounds.state import JobState
from ps.rounds.step_reply import StepReplies
from ps.rounds.update_norms import UpdateNorms
from ps.rounds.whole_model import WholeModel
from ps.shards.client import RemoteShards
from ps.shards.core import MAX_WAIT_S
from common.transport.chunked import Vector
from common.transport.layout import Layout, flatten_params
from common.transport.messages import Beat, JobStatus, JoinAsk, JoinInfo, PushMeta, StepReply, StoreAnswer, StoreCall
from common.transport.payload import Payload
from common.transport.wire import ChunkReceiver
from ps.serving.worker_keys import WorkerKeys


class Coordinator(JobState):
    """Owns the job's state; one instance per server, driven from one asyncio event loop."""

    def __init__(
        self,
        spec: JobSpec,
        policy: BatchPolicy,
        model: torch.nn.Module,
        dataset: TrainingData,
        *,
        adjust_every: int | None = None,
        asp: AspSettings | None = None,
        adaptive: AdaptiveSettings | None = None,
        max_workers: int | None = None,
        evict_after: float = 10.0,
        checkpoint_every: int | None = None,
        on_checkpoint: Callable[[dict[str, Any], int], None] | None = None,
        metrics: MetricsLog | None = None,
        evaluator: BackgroundEvaluator | None = None,
        clock: Callable[[], float] = time.monotonic,
        rendezvous: Rendezvous | None = None,
        shards: RemoteShards | None = None,
        fast_path_on_gpus: Callable[[], Rendezvous] | None = None, limits: Limits | None = None,
        norms: NormLimits | None = None,
    ) -> None:
        """`fast_path_on_gpus` (--allreduce auto): starts the rendezvous where the fast path is taken (ps.rounds.fast_path);
        `norms`: the bound on a push's norm (ps.rounds.update_norms; default off)."""
        check_paths(spec, rendezvous, shards, fast_path_on_gpus)
        self.spec = spec
        self.replace_policy(policy)
        self.layout = Layout.of(model)
        self.shards = shards
        full = flatten_params(model)
        # --shards: this server holds range 0 of the flat parameters; the shard servers the rest
        self.own_numel = shards.own[1] if shards is not None else self.layout.numel
        self.store = ParameterStore(full[: self.own_numel], spec)
        self.evict_after = evict_after
        self.heartbeat_interval = min(1.0, evict_after / 4)
        self.metrics = metrics or MetricsLog(None)
        self.clock = clock
        self.events = RoundEvents()
        self.membership = Membership(max_workers or spec.workers)
        self.keys = WorkerKeys()  # the workers' secrets (and the shards' key to check them)
        self.round = self.version = self.epoch = self.samples = 0
        self.done, self.reason = False, ""
        self.rendezvous = rendezvous if spec.allreduce else None
        self.payload = Payload()  # the transport may set its framing (Payload.use_frame)
        self.store.before_change.append(self.payload.complete)  # a reply in flight sends its version whole
        self.fast_path = FastPath(self, fast_path_on_gpus)
        self.parking = Parking(self)
        self.bsp = BspRound(self, self.parking)
        samples = len(dataset.train)  # type: ignore[arg-type]  # common.job.splits.Splits checks __len__
        self.adaptive = AdaptiveBatchSizing(self, self.bsp, adaptive or AdaptiveSettings(), samples)
        self.sampling = Sampling(self, samples)  # --sampling exact: the epochs' slices
        self.epochs = Epochs(self, samples, adjust_every, checkpoint_every, self.sampling.completed_epochs)
        self.asp = AspUpdates(self, self.epochs, asp or AspSettings())
        self.admission = Admission(self, self.epochs, self.fast_path, self.bsp)
        self.whole_model = WholeModel(self, (full, None) if shards else None)
        self.evaluation = Evaluations(self, evaluator, self.epochs, self.whole_model)
        self.path_trial = PathTrial(self, self.bsp, self.fast_path, self.whole_model, self.stop, self.adaptive.on)
        self.checks = PushChecks(self, self.bsp, self.asp, self.fast_path, self.whole_model, self.path_trial)
        self.norms = UpdateNorms(self, norms or NormLimits())
        self.end = JobEnd(self, self.whole_model)
        self.limits = limits or Limits()  # what a peer may make the server wait for or hold (ps.rounds.deadlines)
        self.deadlines = Deadlines(self, self.bsp, self.asp, self.epochs, self.limits, lambda w, why: self.departures.remove(w, "evict", why))
        # a Push stream's hold: in_flight.slot(begin_push, cancel)
        self.in_flight = PushesInFlight(self.limits.push_bytes, self.limits.admit_wait_s)
        self.checkpoints = Checkpoints(self, self.whole_model, self.epochs, self.sampling, self.adaptive, self.admission)
        self.milestones = Milestones(self, self.epochs, self.evaluation, self.adaptive, self.path_trial, self.whole_model,
                                     on_checkpoint, self.checkpoint_state)
        self.round_close = RoundClose(self, self.bsp, self.sampling, self.epochs, self.adaptive, self.fast_path,
                                      self.deadlines, self.path_trial, self.whole_model, self.admission, self.milestones,
                                      self.stop, min(evict_after, MAX_WAIT_S))
        self.replies = StepReplies(self, self.sampling, self.asp, self.adaptive, self.fast_path, self.path_trial,
                                   self.whole_model, self.end)
        self.departures = Departures(self, self.admission, self.epochs, self.fast_path, self.end, self.round_close,
                                     self.stop, evict_after)
        self._subscribe()

    def _subscribe(self) -> None:
        """Who hears of each round event, in this order."""
        events = self.events
        events.plan_changed.subscribe(lambda: self.epochs.log_adjust(changed=True))
        events.plan_changed.subscribe(self.fast_path.regroup)
        for removed in (self.sampling.removed, self.path_trial.removed, self.end.forget, self.bsp.forget):
            events.member_removed.subscribe(removed)
        events.member_removed.subscribe(lambda member: self.asp.release())  # SSP: a slowest worker gone lets the others go on
        events.member_removed.subscribe(self._revoke)
        for ended in (self.epochs.ended, lambda reason: self.asp.release(), self.whole_model.ended, self.admission.ended):
            events.ended.subscribe(ended)

    # ----------------------------------------------------------------- membership
    def _revoke(self, member: Member) -> None:
        """`member` left or was evicted: its push streams still arriving end (ps.rounds.inflight), and with
        --shards its id is revoked at every shard with the next commit, before the round's newcomers enter
        (ps.shards.core). Its calls here are refused from now on (Membership.get), the fast path's store
        included (a new group generation drops its keys)."""
        self.in_flight.drop(member.worker_id, str(self.membership.gone(member.worker_id)))
        if self.shards is not None:
            self.shards.revoke(member.worker_id)

    async def join(self, ask: JoinAsk) -> JoinInfo:
        """Admit a worker. Before the start it waits for all expected workers; later it
        enters at the next round boundary (BSP) or at once (ASP) and gets a share of B. Its dataset is
        checked by Sampling; `ask.switch_paths`: it can follow --allreduce auto's trial (ps.rounds.path_trial)."""
        max_batch = ask.max_batch or None  # None: no bound of its own
        self.admission.check(ask.name, ask.cores, ask.cuda_device, max_batch)
        self.sampling.check_join(ask.dataset_length, ask.dataset_fingerprint)
        member = await self.admission.admit(ask.name, ask.cores, ask.cuda_device, max_batch, ask.switch_paths)
        member.seen(self.clock())
        plan = self.policy.plan()
        self.replies.tell(member, plan[member.name])
        return JoinInfo(
            member.worker_id, member.index, plan[member.name], self.round, self.version, self.epoch,
            self.spec.to_json(), self.layout, self.heartbeat_interval, self.fast_path.group_info(member, plan),
            tuple(self.shards.info()) if self.shards else (), self.keys.secret(member.worker_id), sum(plan.values()),
        )

    def member(self, worker_id: str, secret: str) -> Member:
        """The active member a call names, once it proved to be that worker (ps.serving.worker_keys).
        An id the server never issued (or has forgotten: a restart) is NOT_FOUND whatever the secret; a
        known one is checked before its state is told (pending, departed: FAILED_PRECONDITION / NOT_FOUND)."""
        if self.membership.known(worker_id):
            self.keys.check(worker_id, secret)
        return self.membership.get(worker_id)

    async def leave(self, worker_id: str, secret: str) -> None:
        """Remove a worker; a BSP round that only waited on it closes with the others."""
        self.member(worker_id, secret)
        self.departures.remove(worker_id, "leave", "left")

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
        """Apply a validated push; BSP returns once the round closes, ASP at once."""
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
            return self.replies.reply(member, params=not header_only)
        return with_optimizer_state(self.replies.reply(member, params=False), self.store.flat_optimizer_state(), self.payload)

    async def wait_for_batch(self, worker_id: str, secret: str) -> None:
        """A parked worker's long poll (ps.rounds.parking): returns once the plan gives it a batch."""
        await self.parking.wait_for_batch(self.member(worker_id, secret))

    async def load_shards(self) -> None:
        """--shards: hand every shard its range (initial or resumed parameters) before workers join."""
        await self.whole_model.load_shards(self.keys.key)

    # ------------------------------------------------------------- checkpoints
    def checkpoint_state(self) -> dict[str, Any]:
        """A self-contained snapshot of everything needed to resume (tensors cloned)."""
        return self.checkpoints.state_dict()

    def restore(self, state: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
        """Load a checkpoint before the job starts (Checkpoints.restore); the batch policy settings that
        differ from the checkpoint's, {field: (checkpoint's, this server's)}: this server's apply."""
        return self.checkpoints.restore(state)

    # ------------------------------------------------------------ end of the job
    def stop(self, reason: str = "stopping") -> None:
        """Graceful shutdown: drop the open round's partial sum; every worker's next call hears the job stops."""
        if self.done:
            return
        self.bsp.abort()
        self.finish(reason)
        self.bsp.resolve()
        self.end.check()

    def note_reply_sent(self) -> None:
        """Called after a reply is delivered; the job finishes once every worker was told it is done."""
        self.end.check()

    async def wait_finished(self, grace_s: float) -> None:
        """Wait until the job is done and every worker has heard so (or grace_s after done)."""
        await self.end.wait(grace_s)

    def summary(self) -> dict[str, Any]:
        e = self.evaluation
        return {**summary(self, self.epochs.start_time, self.epochs.end_time, e.last_accuracy, e.last_loss),
                **self.deadlines.report(), **self.sampling.report(), **self.norms.report()}

    def status(self) -> JobStatus:
        path = "auto" if self.fast_path.undecided else "allreduce" if self.spec.allreduce else "ps"
        why = self.path_trial.why or self.fast_path.why  # --allreduce auto's choice
        return status(self, path, why, self.evaluation.last_accuracy, **self.adaptive.status())

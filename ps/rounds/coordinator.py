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
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ps.control.config import config_changes
from ps.control.policy import BatchPolicy
from common.errors import FailedPrecondition, InvalidArgument
from common.job.datasets import TrainingData
from ps.rounds.evaluator import BackgroundEvaluator
from common.job.spec import JobSpec
from ps.ops.metrics import MetricsLog
from common.params.store import ParameterStore
from ps.rounds.adaptive_batch import AdaptiveBatchSizing, AdaptiveSettings
from ps.rounds.admission import Admission, own_max_batch
from ps.rounds.asp import AspSettings, AspUpdates
from ps.rounds.bsp import BspRound
from ps.rounds.checkpoint_state import checkpoint_state, load_params, params_digest, saved_policy
from ps.rounds.deadlines import Deadlines, Limits
from ps.rounds.epochs import Epochs
from ps.rounds.evaluations import Evaluations
from ps.rounds.fast_path import FastPath, check_paths, with_optimizer_state
from ps.rounds.inflight import PushesInFlight
from ps.rounds.job_end import JobEnd
from ps.rounds.membership import Member, Membership
from ps.rounds.parking import Parking
from ps.rounds.path_trial import PathTrial
from ps.rounds.push_checks import PushChecks
from ps.rounds.rendezvous import Rendezvous
from ps.rounds.reports import status, summary
from ps.rounds.sampling import Sampling
from ps.rounds.state import JobState
from ps.rounds.whole_model import WholeModel
from ps.shards.client import RemoteShards, ShardFailure
from ps.shards.core import MAX_WAIT_S
from common.transport.chunked import Vector
from common.transport.layout import Layout, flatten_params
from common.transport.messages import (Beat, JobStatus, JoinAsk, JoinInfo, PushMeta, StepHeader, StepReply, StoreAnswer,
                                       StoreCall)
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
    ) -> None:
        """`fast_path_on_gpus` (--allreduce auto): starts the rendezvous where the fast path is taken (ps.rounds.fast_path)."""
        check_paths(spec, rendezvous, shards, fast_path_on_gpus)
        self.spec = spec
        self.policy = policy
        self.layout = Layout.of(model)
        self.shards = shards
        full = flatten_params(model)
        # --shards: this server holds range 0 of the flat parameters; the shard servers the rest
        self.own_numel = shards.own[1] if shards is not None else self.layout.numel
        self.store = ParameterStore(full[: self.own_numel], spec)
        self.evict_after = evict_after
        self.heartbeat_interval = min(1.0, evict_after / 4)
        self.on_checkpoint = on_checkpoint
        self.metrics = metrics or MetricsLog(None)
        self.clock = clock
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
        train_size = len(dataset.train)  # type: ignore[arg-type]  # common.job.splits.Splits checks __len__
        self.adaptive = AdaptiveBatchSizing(self, self.bsp, adaptive or AdaptiveSettings(), self._replanned, train_size)
        self.sampling = Sampling(self, train_size)  # --sampling exact: the epochs' slices
        self.epochs = Epochs(self, train_size, adjust_every, checkpoint_every, self.sampling.completed_epochs)
        self.asp = AspUpdates(self, self.epochs, asp or AspSettings())
        self.admission = Admission(self, self.epochs, self.fast_path)
        self.whole_model = WholeModel(self, (full, None) if shards else None)
        self.evaluation = Evaluations(self, evaluator, self.epochs, self.whole_model)
        self.path_trial = PathTrial(self, self.bsp, self.fast_path, self.whole_model, self.stop, self.adaptive.on)
        self.checks = PushChecks(self, self.bsp, self.asp, self.fast_path, self.whole_model, self.path_trial)
        self.end = JobEnd(self, self.whole_model)
        self.limits = limits or Limits()  # what a peer may make the server wait for or hold (ps.rounds.deadlines)
        self.deadlines = Deadlines(self, self.bsp, self.asp, self.epochs, self.limits, lambda w, why: self._remove(w, "evict", why))
        self.in_flight = PushesInFlight(self.limits.push_bytes)  # a Push stream's hold: in_flight.slot(begin_push)

    # ----------------------------------------------------------------- membership
    async def join(self, ask: JoinAsk) -> JoinInfo:
        """Admit a worker. Before the start it waits for all expected workers; later it
        enters at the next round boundary (BSP) or at once (ASP) and gets a share of B. Its dataset is
        checked by Sampling; `ask.switch_paths`: it can follow --allreduce auto's trial (ps.rounds.path_trial)."""
        max_batch = ask.max_batch or None  # None: no bound of its own
        self.admission.check(ask.name, ask.cores, ask.cuda_device, max_batch)
        self.sampling.check_join(ask.dataset_length, ask.dataset_fingerprint)
        member = self.membership.admit(ask.name, ask.cores, self.clock())
        member.cuda_device, member.max_batch, member.switch_paths = ask.cuda_device, max_batch, ask.switch_paths
        try:
            if not self.admission.started.is_set():
                if self.admission.all_here():
                    self._start()
            # BSP: the members are computing the open round with the plan they were told, so a newcomer
            # enters when it closes, with a re-split that its replies carry (unless nobody is training)
            elif self.spec.mode == "asp" or not self.members:
                self._activate_pending()
            await member.activated.wait()
        except asyncio.CancelledError:
            # the caller gave up (deadline, crash) before it was admitted: free its slot and name
            if member.worker_id in self.membership.pending:
                self.membership.remove(member.worker_id, "gone before it was admitted")
            raise
        if self.done or member.worker_id not in self.members:
            raise FailedPrecondition(member.turned_away or f"the job has ended ({self.reason})")
        member.last_seen = self.clock()
        plan = self.policy.plan()
        self._tell(member, plan[member.name])
        return JoinInfo(
            member.worker_id, member.index, plan[member.name], self.round, self.version, self.epoch,
            self.spec.to_json(), self.layout, self.heartbeat_interval, self.fast_path.group_info(member, plan),
            tuple(self.shards.info()) if self.shards else (), self.keys.secret(member.worker_id), sum(plan.values()),
        )

    def _start(self) -> None:
        """All expected workers are here: choose the path (--allreduce auto), the first plan; open round 0."""
        if self.fast_path.undecided and self.fast_path.choose():
            self.bsp.follow_path()  # the workers sum their gradients themselves
        if not self.admission.start_resumed():
            self._activate_pending()
        self.epochs.start_time = self.epochs.epoch_start_time = self.clock()
        self.admission.started.set()

    def _activate_pending(self) -> None:
        """Move pending workers into the job and re-split B over everyone."""
        if not self.membership.pending:
            return
        now = self.clock()
        for member in list(self.membership.pending.values()):
            self.membership.activate(member.worker_id)
            bound = own_max_batch(self.policy.config, member.max_batch)
            self.policy.add_worker(member.name, cores=member.cores, max_batch=bound)
            member.last_seen = member.pushed_at = now  # an ASP newcomer's first push is due from now
            self.metrics.write("join", worker=member.name, cores=member.cores, step=self.step, epoch=self.epoch)
        self.policy.replan()
        self._replanned()
        for member in self.members.values():
            member.activated.set()

    def _replanned(self) -> None:  # a new plan (workers came, --adaptive-batch changed B): its record, the groups
        self.epochs.log_adjust(changed=True)
        self.fast_path.regroup()

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
        self._remove(worker_id, "leave", "left")

    def heartbeat(self, worker_id: str, secret: str) -> Beat:
        self.member(worker_id, secret).last_seen = self.clock()
        return Beat(self.done, self.epoch, self.round, self.version)

    async def rendezvous_call(self, worker_id: str, secret: str, call: StoreCall) -> StoreAnswer:
        """--allreduce: a member's call on its group generation's store (FastPath.store_call)."""
        self.member(worker_id, secret)
        return await self.fast_path.store_call(worker_id, call)

    def evict_stale(self) -> list[str]:
        """Evict workers silent for longer than evict_after; returns their names."""
        if not self.admission.started.is_set() or self.done:
            return []
        gone = self.membership.stale(self.clock(), self.evict_after)
        for member in gone:
            self._remove(member.worker_id, "evict", f"evicted after {self.evict_after:g}s without a heartbeat")
        return [m.name for m in gone]

    async def reap_forever(self, interval: float) -> None:
        """Background task: evict silent workers, and members past a deadline (ps.rounds.deadlines), until the job ends."""
        while not self.done:
            await asyncio.sleep(interval)
            self.evict_stale()
            self.deadlines.check()

    def _remove(self, worker_id: str, event: str, reason: str) -> None:
        """Drop a worker (leave or eviction), re-split B over the others, close a round it held up."""
        member = self.membership.remove(worker_id, reason)
        self.sampling.removed(member)
        self.path_trial.removed(member)
        self.end.told_done.discard(worker_id)
        self.bsp.pushed.discard(worker_id)
        self.asp.release()  # SSP: a slowest worker gone lets the others go on
        self.metrics.write(event, worker=member.name, reason=reason, step=self.step, epoch=self.epoch)
        self.fast_path.regroup()
        if self.done:
            self.end.check()
            return
        if member.name in self.policy.plan():
            self.policy.remove_worker(member.name)
        if self.members and self.policy.plan():
            try:
                self.policy.replan()
            except ValueError as exc:  # the survivors' --max-batch cannot make up B: end, do not hang the round
                self.stop(f"the workers left cannot split --global-batch ({exc})")
                return
            self.epochs.log_adjust(changed=True)
        pushes = self.bsp.pushes()
        if pushes and self.bsp.all_pushed():
            self._close_round()  # its boundary admits the workers waiting to join
        elif pushes and self.rendezvous is not None:
            self.fast_path.note_close_without(self.bsp.pushed)  # every report here came from the generation this
            self._close_round()  # removal replaced: close before every member reported (FastPath.note_close_without)
        elif not self.members:
            self._activate_pending()  # nobody computes the open round: the waiting workers start it

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
            member.last_seen = self.clock()
            self.whole_model.load_snapshot(values)  # and what waited for it (ps.rounds.path_trial's switch back)
            return self._reply(member)
        self.checks.sequence(member, meta)
        self.checks.told(member, meta)
        if not self.done and meta.kind == "values":
            self.checks.values(member, meta, values)
        self.deadlines.pushed(member)
        if self.done:
            return self._reply(member)
        if self.spec.mode == "bsp":
            return await self._push_bsp(member, meta, values)
        return await self._push_asp(member, meta, values)

    async def _push_bsp(self, member: Member, meta: PushMeta, grad: Vector) -> StepReply:
        ms = self.bsp.balanced_ms(member, meta)
        if ms is not None:
            exposed = meta.times.fitted_exposed_ms(self.spec.balance)
            self.policy.observe(member.name, meta.batch_size, ms, exposed_ms=exposed)
        self.bsp.add(member, meta, grad)
        self.sampling.pushed(member, meta.batch_size)
        self.adaptive.push(meta, grad)
        self.epochs.count_push(member, ms, meta.batch_size, meta.times.exposed_ms, meta.times.data_wait_ms)
        future = self.bsp.mark_pushed(member)
        if self.bsp.all_pushed():
            self._close_round()
        elif meta.kind == "report" and 0 < meta.generation < self.fast_path.generation():
            self.fast_path.note_close_without(self.bsp.pushed)  # this report's group took the step, and a removal
            self._close_round()  # has replaced it
        await asyncio.shield(future)
        return self._reply(member)

    def _close_round(self) -> None:
        if self.shards is not None:
            if not self.bsp.committing:
                self.bsp.committing = True
                self.bsp.commit_task = asyncio.get_running_loop().create_task(self._commit_sharded())
            return
        self._next_round(self.bsp.step_store())
        self.bsp.resolve()

    def _next_round(self, batch: int) -> None:
        self.bsp.next_round()
        self.deadlines.round_closed(batch)
        self.sampling.round_closed()
        self.round += 1
        self.version += 1
        self.epochs.first_round()
        self._advance(batch)
        self.path_trial.round_closed(batch)  # may switch the path: the round's replies say so
        if not self.done and not self.path_trial.awaiting:  # a newcomer waits for the parameters too
            self._activate_pending()

    async def _commit_sharded(self) -> None:
        """--shards: step every range at once (the shards' in their processes, range 0 here), then
        run what needs the whole model (evaluation, checkpoints) before any worker hears of the
        new round, so the shards hold still while their ranges are fetched."""
        try:
            if not self.done:
                batch = await self.bsp.commit_shards(wait_s=min(self.evict_after, MAX_WAIT_S))
                self._next_round(batch)
                await self.whole_model.run_after_fetch()
        except Exception as exc:  # noqa: BLE001 (a shard failed, or a bug: either way the ranges may disagree)
            error = str(exc) if isinstance(exc, ShardFailure) else f"round commit failed: {exc!r}"
            self.metrics.write("shard_failure", step=self.step, error=error)
            self.stop(f"stopping: {error}")
        finally:
            self.bsp.committing = False
            self.bsp.resolve()

    async def _push_asp(self, member: Member, meta: PushMeta, delta: Vector) -> StepReply:
        self.asp.apply(member, meta, delta)
        self.sampling.pushed(member, meta.batch_size)
        self._advance(meta.batch_size)
        await self.asp.wait_turn(member)  # --staleness-bound: while its worker is too far ahead
        return self._reply(member)

    # -------------------------------------------------------------- pull / reply
    def pull(self, worker_id: str, secret: str, header_only: bool = False, optimizer_state: bool = False) -> StepReply:
        """The worker's plan with the parameters (`header_only`: without), or with the optimizer's flat
        state instead (`optimizer_state`: an --allreduce worker starting from the server's copy)."""
        member = self.member(worker_id, secret)
        if optimizer_state and self.shards is not None:
            raise InvalidArgument("the optimizer state is pulled from an unsharded server only (--allreduce jobs)")
        member.last_seen = self.clock()
        if not optimizer_state:
            return self._reply(member, params=not header_only)
        return with_optimizer_state(self._reply(member, params=False), self.store.flat_optimizer_state(), self.payload)

    async def wait_for_batch(self, worker_id: str, secret: str) -> None:
        """A parked worker's long poll (ps.rounds.parking): returns once the plan gives it a batch."""
        await self.parking.wait_for_batch(self.member(worker_id, secret))

    @property
    def params_dtype(self) -> str:
        """Wire dtype of the parameters the server sends (allreduce: fp32, they seed every worker's copy)."""
        return "float32" if self.rendezvous is not None else self.spec.wire_dtype

    def _current_payload(self) -> Sequence[bytes]:
        return self.payload.get(self.version, self.store, self.params_dtype)

    def _tell(self, member: Member, batch: int) -> None:
        """Record the batch a join or a reply tells `member` for the open round (ASP: this version)."""
        member.tell(self.step, batch, keep_after=self.round - 1 if self.spec.mode == "bsp" else None)

    def _reply(self, member: Member, params: bool | None = None) -> StepReply:
        """The header for the worker's next step, with the parameters unless `params` is False
        (default: only without --allreduce, whose workers keep the parameters themselves)."""
        params = self.path_trial.reply_carries_params(self.rendezvous is None) if params is None else params
        plan = self.policy.plan()
        group = self.fast_path.group_info(member, plan)
        batch, ranges, ahead = self.sampling.slice_for(member, plan.get(member.name, 0))  # --sampling exact: its samples
        global_batch = sum(plan.values())
        lr = self.asp.lr(batch, global_batch) if self.spec.mode == "asp" else self.adaptive.lr_at(self.epoch)
        if self.done:
            self.end.told_done.add(member.worker_id)
        self._tell(member, batch)
        header = StepHeader(
            round=self.round, version=self.version, epoch=self.epoch, batch_size=batch, done=self.done, lr=lr,
            global_batch=global_batch, wire_dtype=self.params_dtype, num_values=self.own_numel if params else 0,
            reason=self.reason, group=group, slice=ranges, next_slice=ahead, path=self.path_trial.path(),
            snapshot_requested=self.whole_model.asks_snapshot(group) or self.path_trial.asks_snapshot(member),
        )
        return StepReply(header, self._current_payload() if params else self.payload.empty())

    # ------------------------------------------------------------ the whole model
    async def load_shards(self) -> None:
        """--shards: hand every shard its range (initial or resumed parameters) before workers join."""
        await self.whole_model.load_shards(self.keys.key)

    # ------------------------------------------------------- epochs and control
    def _advance(self, batch: int) -> None:
        """Count samples; run epoch ends, step-based policy decisions and checkpoints."""
        self.epochs.count(batch)
        while not self.done and self.epochs.epoch_over():
            self._end_epoch()
        if self.done:
            return
        self.adaptive.after_round()  # before the policy's decision resets the times it measured
        if self.epochs.adjust_due() and not self.path_trial.holds_plan:  # the trial times both paths at one plan
            self.path_trial.decided(changed=self.epochs.adjust())
        if self.epochs.checkpoint_due():
            self._checkpoint()

    def _end_epoch(self) -> None:
        self.epochs.end_epoch()
        self.evaluation.submit(self.epoch)
        self.store.set_lr(self.adaptive.lr_at(self.epoch))
        if self.epoch >= self.spec.epochs:
            self._finish("finished")
            return
        self.adaptive.at_epoch_end()
        if self.epochs.adjust_every is None and not self.path_trial.holds_plan:
            self.path_trial.decided(changed=self.epochs.adjust())
        if self.epochs.checkpoint_every is None:
            self._checkpoint()

    # ------------------------------------------------------------- checkpoints
    def checkpoint_state(self) -> dict[str, Any]:
        """A self-contained snapshot of everything needed to resume (tensors cloned)."""
        return {**checkpoint_state(self, self.whole_model.params(), self.whole_model.optimizer_state()),
                **self.adaptive.state_dict(), **self.sampling.state_dict()}

    def restore(self, state: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
        """Load a checkpoint before the job starts; workers then rejoin. Returns the batch policy
        settings that differ from the checkpoint's, {field: (checkpoint's, this server's)}: this
        server's apply."""
        saved = saved_policy(state, self)
        shard_state = load_params(state, self)
        if shard_state is not None:
            self.whole_model.shard_state = shard_state
        self.round, self.version = int(state["round"]), int(state["version"])
        self.epoch, self.samples = int(state["epoch"]), int(state["samples"])
        self.epochs.epoch_start_samples = self.samples
        self.sampling.restore(state)  # the epoch's cursor and the ranges put back
        self.adaptive.restore(state)  # its B: the policy the checkpoint's is compared with and adopted into
        self.store.set_lr(self.adaptive.lr_at(self.epoch))
        self.admission.saved_policy = saved
        changes = config_changes(saved.config, self.policy.config)
        self.metrics.write("resume", step=self.step, epoch=self.epoch, round=self.round, version=self.version,
                           params_sha256=params_digest(state["params"]),
                           controller_changes={name: list(pair) for name, pair in changes.items()})
        return changes

    def _checkpoint(self) -> None:
        self.epochs.steps_since_checkpoint = 0
        if self.on_checkpoint is not None and not self.whole_model.defer(self._save):
            self._save()

    def _save(self) -> None:
        if self.on_checkpoint is not None:
            self.on_checkpoint(self.checkpoint_state(), self.step)

    # ------------------------------------------------------------ end of the job
    def _finish(self, reason: str) -> None:
        self.done = True
        self.reason = reason
        self.epochs.end_time = self.clock()
        self.metrics.write("end", reason=reason, step=self.step, epoch=self.epoch)
        self.asp.release()
        self.whole_model.defer(lambda: None)  # allreduce: the final global model, for the last checkpoint
        for member in self.membership.pending.values():
            member.activated.set()

    def stop(self, reason: str = "stopping") -> None:
        """Graceful shutdown: drop the open round's partial sum; every worker's next call hears the job stops."""
        if self.done:
            return
        self.bsp.abort()
        self._finish(reason)
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
                **self.deadlines.report(), **self.sampling.report()}

    def status(self) -> JobStatus:
        path = "auto" if self.fast_path.undecided else "allreduce" if self.spec.allreduce else "ps"
        why = self.path_trial.why or self.fast_path.why  # --allreduce auto's choice
        return status(self, path, why, self.evaluation.last_accuracy, **self.adaptive.status())

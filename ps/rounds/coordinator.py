"""The server's core: membership, BSP rounds / ASP updates, epochs, the controller, evaluation.

It speaks in plain Python values (no gRPC): the servicer decodes a request, calls one method
here, and encodes what comes back. Every method validates before it mutates, so a refused
request (a ServiceError) leaves the parameters, the round and the controller as they were.
The controller is keyed by worker name, so a worker that rejoins (after an eviction or a
server restart) under its name finds its place in the plan again.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from ps.control.config import config_changes
from ps.control.controller import BatchController
from ps.errors import FailedPrecondition, InvalidArgument
from ps.job.datasets import Dataset
from ps.job.evaluator import BackgroundEvaluator
from ps.job.spec import JobSpec
from ps.ops.metrics import MetricsLog
from ps.params.aggregation import WeightedMean, asp_lr
from ps.params.store import ParameterStore
from ps.rounds.membership import MAX_NAME, Member, Membership
from ps.rounds.rendezvous import Rendezvous, fast_path_fits, hub_rank
from ps.shards.client import RemoteShards, ShardFailure
from ps.shards.core import MAX_WAIT_S
from ps.shards.ranges import slice_optimizer_state
from ps.transport.chunked import Vector, as_tensor
from ps.transport.layout import Layout, flatten_params
from ps.transport.magnitude import PUSH_MARGIN, OverflowRisk, magnitude_of
from ps.transport.messages import MAX_COMPUTE_MS, PUSH_KINDS, Beat, GroupInfo, JoinInfo, PushMeta, StepReply
from ps.transport.payload import FramedChunks, Payload, TensorSource
from ps.transport.wire import ChunkReceiver, check_wire_dtype
from ps.transport.worker_keys import WorkerKeys

CHECKPOINT_FORMAT = 1


def params_digest(flat: torch.Tensor) -> str:
    """SHA-256 of the parameters' fp32 bytes (to show a resume restored them exactly)."""
    return hashlib.sha256(flat.detach().contiguous().numpy().tobytes()).hexdigest()


class Coordinator:
    """Owns the job's state; one instance per server, driven from one asyncio event loop."""

    def __init__(
        self,
        spec: JobSpec,
        controller: BatchController,
        model: torch.nn.Module,
        dataset: Dataset,
        *,
        adjust_every: int | None = None,
        max_staleness: int | None = None,
        max_workers: int | None = None,
        evict_after: float = 10.0,
        checkpoint_every: int | None = None,
        on_checkpoint: Callable[[dict[str, Any], int], None] | None = None,
        metrics: MetricsLog | None = None,
        evaluator: BackgroundEvaluator | None = None,
        clock: Callable[[], float] = time.monotonic,
        rendezvous: Rendezvous | None = None,
        shards: RemoteShards | None = None,
        fast_path_on_gpus: Callable[[], Rendezvous] | None = None,
    ) -> None:
        """`fast_path_on_gpus` (`ps-server --allreduce auto`): a job on the PS path that switches to
        the collective fast path when the workers that start it all compute on GPUs of their own
        (ps.rounds.rendezvous.fast_path_fits), hosting the rendezvous this callable starts. Decided once, at
        the start; the balance then becomes compute time (busy time and the cycle are PS-path times)."""
        if spec.allreduce and rendezvous is None:
            raise ValueError("an allreduce job needs a Rendezvous")
        if shards is not None and (spec.mode != "bsp" or spec.allreduce):
            raise ValueError("--shards serves BSP jobs without --allreduce")
        if fast_path_on_gpus is not None and (spec.mode != "bsp" or spec.allreduce or shards is not None):
            raise ValueError("the fast path on GPUs is chosen for BSP jobs on one server that are not --allreduce already")
        self._fast_path_on_gpus = fast_path_on_gpus
        self.spec = spec
        self.controller = controller
        self.layout = Layout.of(model)
        self.shards = shards
        full = flatten_params(model)
        # --shards: this server holds range 0 of the flat parameters; the shard servers the rest
        self.own_numel = shards.own[1] if shards is not None else self.layout.numel
        self.store = ParameterStore(full[: self.own_numel], spec)
        self._shard_state: tuple[torch.Tensor, dict[str, Any] | None] | None = (full, None) if shards else None
        self._full_view: tuple[torch.Tensor, dict[str, Any]] | None = None  # --shards: fetched whole model
        self._committing = False
        self._commit_task: asyncio.Task[None] | None = None  # held: the loop keeps only weak references
        self._first_round_logged = False
        self.samples_per_epoch = len(dataset.train_x)
        self.adjust_every = adjust_every
        self.max_staleness = max_staleness
        self.evict_after = evict_after
        self.heartbeat_interval = min(1.0, evict_after / 4)
        self.checkpoint_every = checkpoint_every
        self.on_checkpoint = on_checkpoint
        self.metrics = metrics or MetricsLog(None)
        self.evaluator = evaluator
        self.clock = clock
        self.membership = Membership(max_workers or spec.workers)
        self.keys = WorkerKeys()  # the workers' secrets (and the shards' key to check them)
        self.round = 0
        self.version = 0
        self.epoch = 0
        self.samples = 0
        self.done = False
        self.reason = ""
        self.last_accuracy: float | None = None
        self.last_loss: float | None = None
        self.evaluations: list[tuple[int, float, float, float]] = []
        self._started = asyncio.Event()
        self._finished = asyncio.Event()
        self._start_time: float | None = None
        self._end_time: float | None = None
        self._epoch_start_time: float | None = None
        self._epoch_start_samples = 0
        self._told_done: set[str] = set()
        self.rendezvous = rendezvous if spec.allreduce else None
        self._accumulator = (WeightedMean(self.own_numel, scale=spec.global_batch)
                             if spec.mode == "bsp" and not spec.allreduce else None)
        self._contributions: dict[str, int] = {}  # --shards: batch per worker in the open round
        self._round_batch = 0  # allreduce: samples reported in the open round
        self._snapshot_requested = False  # allreduce: rank 0 is asked for its parameters
        self._after_snapshot: list[Callable[[], None]] = []  # allreduce: evals/checkpoints waiting for them
        self._loading_snapshot = False
        self._pushed: set[str] = set()
        self._round_future: asyncio.Future[bool] | None = None
        self._replies_sent_at: float | None = None  # --balance cycle: when the open round's replies went out
        self._replied: set[str] = set()  # --balance cycle: the workers they went to (who pushed the last round)
        self.payload = Payload()  # the transport may set its framing (Payload.use_frame)
        self.store.before_change.append(self.payload.complete)  # a reply in flight sends its version whole
        self._steps_since_adjust = 0
        self._steps_since_checkpoint = 0
        self._saved_controller: BatchController | None = None  # a checkpoint's, until the start

    @property
    def members(self) -> dict[str, Member]:
        """Active members by worker id."""
        return self.membership.active

    @property
    def step(self) -> int:
        """The step counter the controller and checkpoints use: BSP rounds, ASP updates."""
        return self.round if self.spec.mode == "bsp" else self.version

    # ----------------------------------------------------------------- membership
    async def join(self, name: str, cores: float, cuda_device: str | None = None) -> JoinInfo:
        """Admit a worker. Before the start it waits for all expected workers; later it
        enters at the next round boundary (BSP) or at once (ASP) and gets a share of B.
        `cuda_device`: the UUID of the GPU the worker computes on ("" unknown), None for CPU."""
        if self.done:
            raise FailedPrecondition(f"the job has ended ({self.reason})")
        self.membership.check_join(name, cores)
        if cuda_device is not None and (len(cuda_device) > MAX_NAME or not cuda_device.isprintable()):
            raise InvalidArgument(f"cuda_device must be a GPU UUID: at most {MAX_NAME} printable characters")
        if not self.controller.can_add(len(self.membership.pending) + 1):
            raise FailedPrecondition(
                f"job full: the global batch {self.spec.global_batch} cannot give one more worker its minimum batch "
                f"({len(self.members)} in the job, {len(self.membership.pending)} waiting); raise --global-batch "
                "or lower --min-batch"
            )
        member = self.membership.admit(name, cores, self.clock())
        member.cuda_device = cuda_device
        try:
            if not self._started.is_set():
                if len(self.membership.pending) >= self.spec.workers:
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
            raise FailedPrecondition(f"the job has ended ({self.reason})")
        member.last_seen = self.clock()
        plan = self.controller.plan()
        self._tell(member, plan[member.name])
        return JoinInfo(
            member.worker_id, member.index, plan[member.name], self.round, self.version, self.epoch,
            self._group_info(member, plan),
            self.rendezvous.host if self.rendezvous else "",
            self.rendezvous.port if self.rendezvous else 0,
            tuple(self.shards.info()) if self.shards else (),
            self.keys.secret(member.worker_id),
        )

    def _start(self) -> None:
        """All expected workers are here: choose the path (--allreduce auto), build the first plan and
        open round 0."""
        if self._fast_path_on_gpus is not None:
            self._choose_path(self._fast_path_on_gpus)
        names = {m.name for m in self.membership.pending.values()}
        saved = self._saved_controller
        if saved is not None and set(saved.workers()) == names:
            # the command line's settings, the checkpoint's measurements (BatchController.with_config)
            self.controller = saved.with_config(self.controller.config)
            for member in list(self.membership.pending.values()):
                self.membership.activate(member.worker_id)
                member.activated.set()
            self._log_adjust(changed=True)
            self._regroup()
        else:
            self._activate_pending()
        self._start_time = self._epoch_start_time = self.clock()
        self._started.set()

    @property
    def may_take_fast_path(self) -> bool:
        """--allreduce auto, before the start: the path is still to be chosen."""
        return self._fast_path_on_gpus is not None

    def _choose_path(self, start_rendezvous: Callable[[], Rendezvous]) -> None:
        """--allreduce auto: take the fast path if the starting workers all compute on GPUs of their
        own. Before any worker is active, so nothing of the PS path has run yet."""
        self._fast_path_on_gpus = None
        starting = sorted(self.membership.pending.values(), key=lambda m: m.index)
        fits, why = fast_path_fits([m.worker_id for m in starting], {m.worker_id: m.cuda_device for m in starting})
        rendezvous = None
        if fits:
            try:
                rendezvous = start_rendezvous()
            except ValueError as exc:
                why = f"{why}, but {exc}"
        if rendezvous is not None:
            self.spec = replace(self.spec, allreduce=True, balance="compute")
            self.rendezvous = rendezvous
            self._accumulator = None
        self.metrics.write("path", allreduce=rendezvous is not None, why=why, balance=self.spec.balance, step=self.step,
                           epoch=self.epoch)

    def _activate_pending(self) -> None:
        """Move pending workers into the job and re-split B over everyone."""
        if not self.membership.pending:
            return
        now = self.clock()
        for member in list(self.membership.pending.values()):
            self.membership.activate(member.worker_id)
            self.controller.add_worker(member.name, cores=member.cores)
            member.last_seen = now
            self.metrics.write("join", worker=member.name, cores=member.cores, step=self.step, epoch=self.epoch)
        self.controller.replan()
        self._log_adjust(changed=True)
        self._regroup()
        for member in self.members.values():
            member.activated.set()

    def member(self, worker_id: str, secret: str) -> Member:
        """The active member a call names, once it proved to be that worker (ps.transport.worker_keys). An id the
        server never issued (or has forgotten: a restart) is NOT_FOUND whatever the secret; a known one
        is checked before its state is told (pending, departed: FAILED_PRECONDITION / NOT_FOUND)."""
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

    def evict_stale(self) -> list[str]:
        """Evict workers silent for longer than evict_after; returns their names."""
        if not self._started.is_set() or self.done:
            return []
        gone = self.membership.stale(self.clock(), self.evict_after)
        for member in gone:
            self._remove(member.worker_id, "evict", f"evicted after {self.evict_after:g}s without a heartbeat")
        return [m.name for m in gone]

    async def reap_forever(self, interval: float) -> None:
        """Background task: evict silent workers until the job ends."""
        while not self.done:
            await asyncio.sleep(interval)
            self.evict_stale()

    def _remove(self, worker_id: str, event: str, reason: str) -> None:
        """Drop a worker (leave or eviction), re-split B over the others, close a round it held up."""
        member = self.membership.remove(worker_id, reason)
        self._told_done.discard(worker_id)
        self._pushed.discard(worker_id)
        self.metrics.write(event, worker=member.name, reason=reason, step=self.step, epoch=self.epoch)
        self._regroup()
        if self.done:
            self._check_finished()
            return
        if member.name in self.controller.plan():
            self.controller.remove_worker(member.name)
        if self.members and self.controller.plan():
            try:
                self.controller.replan()
            except ValueError as exc:  # the survivors' --max-batch cannot make up B: end, do not hang the round
                self.stop(f"the workers left cannot split --global-batch ({exc})")
                return
            self._log_adjust(changed=True)
        pushes = self._accumulator.count if self._accumulator is not None else self._round_batch
        if pushes and self._pushed >= set(self.members):
            self._close_round()  # its boundary admits the workers waiting to join
        elif pushes and self.rendezvous is not None:
            self._close_without()  # every report here came from the generation this removal replaced
        elif not self.members:
            self._activate_pending()  # nobody computes the open round: the waiting workers start it

    def _generation(self) -> int:
        """Allreduce: the current group generation (0 before the first group)."""
        return self.rendezvous.group.generation if self.rendezvous is not None else 0

    def _close_without(self) -> None:
        """Allreduce: close the open round before every member reported it, because a group that a
        leave or eviction has since replaced took its step: a report follows a successful all-reduce.

        That group may have failed part way (a peer gone before the hub's send to some ranks): the
        ranks with the sum reported, the others wait for the next generation and retry the round
        there, where they would wait for the reporters, which wait for the round to close. Closing
        it lets them meet at the next round instead: the next generation adopts a reporter's copy
        (the most advanced one), a rank whose copy is then past its plan's round skips its
        all-reduce, and its late report of the closed round is refused and answered with a pull."""
        missing = sorted(m.name for m in self.members.values() if m.worker_id not in self._pushed)
        self.metrics.write("close_without", round=self.round, workers=missing, step=self.step, epoch=self.epoch)
        self._close_round()

    # ---------------------------------------------------------------------- push
    def begin_push(self, meta: PushMeta) -> ChunkReceiver:
        """Validate a push header and hand back a receiver for its payload."""
        self.store.settle()  # a deferred step may still read the accumulator's sum
        member = self.member(meta.worker_id, meta.secret)
        check_wire_dtype(meta.wire_dtype)
        self._check_kind(meta)
        if meta.kind == "snapshot":
            self._check_snapshot(member, meta)
        elif meta.batch_size <= 0:
            raise InvalidArgument(f"batch size must be > 0, got {meta.batch_size}")
        limit = max(self.spec.global_batch, max(self.controller.plan().values(), default=0))
        if meta.batch_size > limit:
            raise InvalidArgument(f"batch size {meta.batch_size} exceeds the global batch {limit}")
        if not (math.isfinite(meta.compute_ms) and 0 <= meta.compute_ms <= MAX_COMPUTE_MS):
            raise InvalidArgument(f"compute_ms must be finite and in [0, {MAX_COMPUTE_MS:.0f}], got {meta.compute_ms}")
        if meta.kind == "report":
            if meta.num_values != 0:
                raise InvalidArgument(f"a report carries no values (num_values 0), got {meta.num_values}")
            if not 0 <= meta.generation <= self._generation():
                raise InvalidArgument(f"a report's generation must be in [0, {self._generation()}] (0: not said), "
                                      f"got {meta.generation}")
            self._check_sequence(member, meta)
            self._check_batch(member, meta)
            return ChunkReceiver(0, meta.wire_dtype)
        if meta.kind == "snapshot":
            self._check_snapshot_size(meta.num_values)
        elif meta.num_values != self.own_numel:
            where = f"; this server holds values [0, {self.own_numel}), the shards the rest" if self.shards else ""
            raise InvalidArgument(f"buffer has {meta.num_values} values, the layout expects {self.own_numel}{where}")
        if meta.kind != "snapshot":
            self._check_sequence(member, meta)
            self._check_batch(member, meta)
        # the chunks are kept as gRPC handed them over: nothing to copy, pool or give back
        return ChunkReceiver(meta.num_values, meta.wire_dtype)

    def _check_kind(self, meta: PushMeta) -> None:
        """Gradients go to the server only without --allreduce; reports and snapshots only with it."""
        if meta.kind not in PUSH_KINDS:
            raise InvalidArgument(f"push kind must be one of {PUSH_KINDS}, got {meta.kind!r}")
        if self.rendezvous is None and meta.kind != "values":
            raise InvalidArgument(f"a {meta.kind} push is for --allreduce jobs; this job takes gradients (kind values)")
        if self.rendezvous is not None and meta.kind == "values":
            raise InvalidArgument(
                "this job runs the collective fast path (--allreduce): all-reduce among the workers and push a "
                "report (num_values 0), or from rank 0 a snapshot when asked"
            )

    def _check_snapshot(self, member: Member, meta: PushMeta) -> None:
        assert self.rendezvous is not None
        rank = self.rendezvous.rank(member.worker_id)
        if rank != 0:
            raise FailedPrecondition(
                f"only rank 0 sends snapshots; worker {member.name} is rank {rank} of generation "
                f"{self.rendezvous.group.generation}"
            )
        if not self._snapshot_requested:
            raise FailedPrecondition("no snapshot was requested")
        if meta.round != self.round:
            raise FailedPrecondition(f"snapshot of round {meta.round}; the open round is {self.round}")

    def _check_snapshot_size(self, num_values: int) -> None:
        """A snapshot is the parameters, then the optimizer's flat state if it has any (ps.params.flat_state)."""
        numel, state = self.own_numel, self.store.optimizer_state_numel
        if num_values not in (numel, numel + state):
            with_state = f" or {numel + state} (with the optimizer's state)" if state else ""
            raise InvalidArgument(f"a snapshot has {num_values} values; the layout expects {numel}{with_state}")

    def _check_sequence(self, member: Member, meta: PushMeta) -> None:
        if self.done:
            return
        if self.spec.mode == "bsp":
            if meta.round != self.round or self._committing:
                raise FailedPrecondition(f"round {meta.round} is not open; the open round is {self.round}")
            if member.worker_id in self._pushed:
                raise FailedPrecondition(f"worker {member.name} already pushed for round {self.round}")
        else:
            if meta.version > self.version or meta.version < 0:
                raise FailedPrecondition(f"version {meta.version} is unknown; the current version is {self.version}")
            if self.max_staleness is not None and self.version - meta.version > self.max_staleness:
                raise FailedPrecondition(
                    f"version {meta.version} is {self.version - meta.version} versions old, over the limit "
                    f"{self.max_staleness}; pull and recompute"
                )

    async def push(self, meta: PushMeta, values: Vector) -> StepReply:
        """Apply a validated push; BSP returns once the round closes, ASP at once."""
        member = self.member(meta.worker_id, meta.secret)
        if meta.kind == "snapshot":
            self._check_snapshot(member, meta)
            member.last_seen = self.clock()
            self._load_snapshot(values)
            return self._reply(member)
        self._check_sequence(member, meta)
        self._check_batch(member, meta)
        if not self.done and meta.kind == "values":
            self._check_values(member, meta, values)
        member.last_seen = self.clock()
        if self.done:
            return self._reply(member)
        if self.spec.mode == "bsp":
            return await self._push_bsp(member, meta, values)
        return self._push_asp(member, meta, values)

    def _check_values(self, member: Member, meta: PushMeta, values: Vector) -> None:
        """BSP: the round's step stays finite with this gradient in it; ASP: θ + Δ stays finite
        (ps.transport.magnitude). Otherwise InvalidArgument, and nothing changes."""
        bound = magnitude_of(values)
        try:
            if self._accumulator is None:
                self.store.check_update(bound)
                return
            if not self._accumulator.admits(values, meta.batch_size):
                raise OverflowRisk(f"gradient values up to {bound:.3g} overflow the round's sum")
            self.store.check_step(bound * PUSH_MARGIN)
        except OverflowRisk as exc:
            self.metrics.write("overflow_refused", worker=member.name, bound=float(f"{bound:.3g}"), step=self.step,
                               epoch=self.epoch)
            raise InvalidArgument(f"{exc}: push refused, the model is unchanged (values this large would make "
                                  "it non-finite)") from None

    async def _push_bsp(self, member: Member, meta: PushMeta, grad: Vector) -> StepReply:
        ms = self._balanced_ms(member, meta)
        if ms is not None:
            self.controller.observe(member.name, meta.batch_size, ms)
        if self._accumulator is not None:
            self._accumulator.add(grad, meta.batch_size)
            self._contributions[member.worker_id] = meta.batch_size
        else:  # allreduce: the workers applied the step themselves
            self._round_batch += meta.batch_size
        self._record(member, ms, meta.batch_size)
        self._pushed.add(member.worker_id)
        if self._round_future is None:
            self._round_future = asyncio.get_running_loop().create_future()
        future = self._round_future
        if self._pushed >= set(self.members):
            self._close_round()
        elif meta.kind == "report" and 0 < meta.generation < self._generation():
            self._close_without()  # this report's group took the step, and a removal has replaced it
        await asyncio.shield(future)
        return self._reply(member)

    def _close_round(self) -> None:
        if self.shards is not None:
            if not self._committing:
                self._committing = True
                self._commit_task = asyncio.get_running_loop().create_task(self._commit_sharded())
            return
        if self._accumulator is not None:
            # stepped piece by piece as the replies stream the new values (ps.params.store, ps.transport.payload); the
            # accumulator's sum is not reused before begin_push settles the step
            self.store.begin_step(self._accumulator.result(), self._accumulator.bound)
            batch = self._accumulator.weight
            self._accumulator.reset()
        else:  # allreduce: nothing to apply; the parameters arrive with rank 0's snapshots
            batch, self._round_batch = self._round_batch, 0
        self._next_round(batch)
        self._resolve_round()

    def _next_round(self, batch: int) -> None:
        self._replied = set(self._pushed)
        self._pushed.clear()
        self._contributions.clear()
        self.round += 1
        self.version += 1
        if not self._first_round_logged:
            # every worker has built its data and model (after Join) and pushed once: training proper
            self._first_round_logged = True
            self.metrics.write("first_round", step=self.step, epoch=self.epoch,
                               wall_s=round(self.clock() - (self._start_time or self.clock()), 3))
        self._advance(batch)
        if not self.done:
            self._activate_pending()

    async def _commit_sharded(self) -> None:
        """--shards: step every range at once (the shards' in their processes, range 0 here), then
        run what needs the whole model (evaluation, checkpoints) before any worker hears of the
        new round, so the shards hold still while their ranges are fetched."""
        assert self.shards is not None and self._accumulator is not None
        try:
            if not self.done:
                commit = asyncio.ensure_future(self.shards.commit(
                    self.round, dict(self._contributions), self.store.lr, wait_s=min(self.evict_after, MAX_WAIT_S)))
                self.store.apply_gradient(self._accumulator.result(), self._accumulator.bound)
                batch = self._accumulator.weight
                self._accumulator.reset()
                acks = await commit
                if any(ack.missing for ack in acks):
                    self.metrics.write("shard_missing", step=self.step, missing=sorted({w for a in acks for w in a.missing}))
                self._next_round(batch)
                await self._run_whole_model_actions()
        except Exception as exc:  # noqa: BLE001 (a shard failed, or a bug: either way the ranges may disagree)
            error = str(exc) if isinstance(exc, ShardFailure) else f"round commit failed: {exc!r}"
            self.metrics.write("shard_failure", step=self.step, error=error)
            self.stop(f"stopping: {error}")
        finally:
            self._committing = False
            self._resolve_round()

    def _resolve_round(self) -> None:
        self._replies_sent_at = self.clock()
        future, self._round_future = self._round_future, None
        if future is not None and not future.done():
            future.set_result(True)

    def _push_asp(self, member: Member, meta: PushMeta, delta: Vector) -> StepReply:
        self.store.apply_update(delta, magnitude_of(delta))  # checked by _check_values: it cannot refuse now
        self.controller.observe(member.name, meta.batch_size, meta.compute_ms)
        member.staleness_sum += self.version - meta.version
        self.version += 1
        self._record(member, meta.compute_ms, meta.batch_size)
        self._advance(meta.batch_size)
        return self._reply(member)

    def _balanced_ms(self, member: Member, meta: PushMeta) -> float | None:
        """The time the controller balances for this BSP push: the worker's report (compute or busy
        time), or under --balance cycle the server's own measure, from the round's replies going out
        to this push fully arrived; None (nothing observed) for a worker that did not push the
        previous round (its cycle began with a join or a pull, not with this round's reply)."""
        if self.spec.balance != "cycle":
            return meta.compute_ms
        if member.worker_id not in self._replied or self._replies_sent_at is None:
            return None
        return max(0.0, (self.clock() - self._replies_sent_at) * 1000.0)

    def _record(self, member: Member, ms: float | None, batch: int) -> None:
        self.metrics.sample("push", worker=member.name, batch=batch, ms=ms)
        member.updates += 1
        member.epoch_updates += 1
        if ms is not None:
            member.epoch_compute_ms.append(ms)

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
        state = self.store.flat_optimizer_state()
        reply = replace(self._reply(member, params=False), wire_dtype="float32", optimizer_state=True)
        if state is None:
            return reply
        payload = FramedChunks(TensorSource(state), "float32", self.payload.frame, self.payload.chunk_bytes)
        return replace(reply, num_values=state.numel(), payload=payload)

    @property
    def params_dtype(self) -> str:
        """Wire dtype of the parameters the server sends (allreduce: fp32, they seed every worker's copy)."""
        return "float32" if self.rendezvous is not None else self.spec.wire_dtype

    def _current_payload(self) -> Sequence[bytes]:
        return self.payload.get(self.version, self.store, self.params_dtype)

    def _tell(self, member: Member, batch: int) -> None:
        """Record the batch a join or a reply tells `member` for the open round (ASP: this version)."""
        if self.spec.mode == "bsp":
            member.tell(self.round, batch, keep_after=self.round - 1)
        else:
            member.tell(self.version, batch)

    def _check_batch(self, member: Member, meta: PushMeta) -> None:
        """A push's batch size is one the server told this worker for the push's round (ASP: version):
        the aggregation weight and the sample count are the server's plan, not the worker's claim.
        The fast path's worker draws a batch before it reads the reply to its previous report, so a
        report may also carry what it was told for the round before."""
        if self.done or meta.kind == "snapshot":
            return
        step = meta.round if self.spec.mode == "bsp" else meta.version
        told = set(member.told.get(step, ()))
        if meta.kind == "report":
            told |= member.told.get(step - 1, set())
        if meta.batch_size not in told:
            where = f"round {step}" if self.spec.mode == "bsp" else f"version {step}"
            planned = ", ".join(map(str, sorted(told))) or "none"
            raise FailedPrecondition(
                f"batch size {meta.batch_size} is not what this server planned for worker {member.name} at {where} "
                f"(told: {planned}); pull the plan and compute a batch of that size"
            )

    def _group_info(self, member: Member, plan: dict[str, int]) -> GroupInfo:
        """--allreduce: the member's place in the current generation; `plan` (by name) picks the hub."""
        if self.rendezvous is None:
            return GroupInfo()
        group = self.rendezvous.group
        batches = {m.worker_id: plan.get(m.name, 0) for m in self.members.values()}
        return GroupInfo(group.generation, group.rank(member.worker_id), group.world_size, group.backend,
                         hub_rank(group, batches))

    def _reply(self, member: Member, params: bool | None = None) -> StepReply:
        """The header for the worker's next step, with the parameters unless `params` is False
        (default: only without --allreduce, whose workers keep the parameters themselves)."""
        params = self.rendezvous is None if params is None else params
        plan = self.controller.plan()
        group = self._group_info(member, plan)
        batch = plan.get(member.name, 0)
        global_batch = sum(plan.values())
        lr = self.spec.lr_at(self.epoch)
        if self.spec.mode == "asp":
            lr = asp_lr(lr, batch, global_batch, self.spec.lr_scaling) if batch else 0.0
        if self.done:
            self._told_done.add(member.worker_id)
        self._tell(member, batch)
        return StepReply(
            round=self.round,
            version=self.version,
            epoch=self.epoch,
            batch_size=batch,
            done=self.done,
            lr=lr,
            global_batch=global_batch,
            wire_dtype=self.params_dtype,
            num_values=self.own_numel if params else 0,
            payload=self._current_payload() if params else self.payload.empty(),
            reason=self.reason,
            group=group,
            snapshot_requested=self._snapshot_requested and group.rank == 0 and group.world_size > 0,
        )

    # ------------------------------------------------------- allreduce snapshots
    def _regroup(self) -> None:
        """Allreduce: a membership change starts a new group generation (ranks in join order)."""
        if self.rendezvous is None:
            return
        ordered = sorted(self.members.values(), key=lambda m: m.index)
        group = self.rendezvous.regroup([m.worker_id for m in ordered], {m.worker_id: m.cuda_device for m in ordered})
        if group is not None:
            self.metrics.write(
                "regroup", generation=group.generation, world_size=group.world_size, backend=group.backend, why=group.why,
                algorithm="hub" if self.spec.hub_reduce(group.backend) else "ring",
                ranks={m.name: group.rank(m.worker_id) for m in ordered}, step=self.step, epoch=self.epoch,
            )

    def _defer_to_snapshot(self, action: Callable[[], None]) -> bool:
        """Run `action` (an evaluation, a checkpoint) once the whole model is here; False: run it now.
        Allreduce: the store's parameters are stale until rank 0 sends a snapshot, so ask for one.
        --shards: the round's commit fetches the shards' ranges before it answers the workers."""
        if self._loading_snapshot or (self.rendezvous is None and self.shards is None):
            return False
        self._after_snapshot.append(action)
        if self.rendezvous is not None:
            self._snapshot_requested = True
        return True

    async def _run_whole_model_actions(self) -> None:
        """--shards: fetch the whole model if an action waits for it, then run the actions."""
        if not self._after_snapshot:
            return
        await self.fetch_whole_model()
        self._run_waiting_actions()

    def _run_waiting_actions(self) -> None:
        """The evaluations/checkpoints that waited for the whole model, now that it is here."""
        actions, self._after_snapshot = self._after_snapshot, []
        self._loading_snapshot = True
        try:
            for action in actions:
                action()
        finally:
            self._loading_snapshot = False

    async def fetch_whole_model(self) -> None:
        """--shards: gather every range and the optimizer state (for checkpoint_state and evaluation)."""
        if self.shards is not None:
            self._full_view = await self.shards.fetch(self.store.flat, self.store.optimizer_state())

    async def load_shards(self) -> None:
        """--shards: hand every shard its range (initial or resumed parameters) before workers join."""
        if self.shards is None or self._shard_state is None:
            return
        params, optimizer = self._shard_state
        await self.shards.load(self.spec.to_json(), params, optimizer, self.round, self.membership.max_workers,
                               self.keys.key)
        self._shard_state = None

    def whole_params(self) -> torch.Tensor:
        """A copy of all parameters (--shards: as last fetched from the shards)."""
        if self.shards is None:
            return self.store.snapshot()
        assert self._full_view is not None, "fetch_whole_model() first"
        return self._full_view[0].clone()

    def _whole_optimizer_state(self) -> dict[str, Any]:
        if self.shards is None:
            return self.store.optimizer_state()
        assert self._full_view is not None, "fetch_whole_model() first"
        return self._full_view[1]

    def _load_snapshot(self, values: Vector) -> None:
        """Rank 0's parameters (and optimizer state) become the global model; then the evaluations and
        checkpoints that waited."""
        numel = self.store.numel
        if values.numel() == numel:
            self.store.assign(values)
            self.store.load_flat_optimizer_state(None)
        else:
            whole = as_tensor(values)
            try:  # first: a malformed state changes nothing
                self.store.load_flat_optimizer_state(whole[numel:])
            except ValueError as exc:
                raise InvalidArgument(f"the snapshot's optimizer state: {exc}") from None
            self.store.assign(whole[:numel])
        self.payload.invalidate()
        self._snapshot_requested = False
        self.metrics.write("snapshot", step=self.step, epoch=self.epoch)
        self._run_waiting_actions()

    # ------------------------------------------------------- epochs and control
    def _advance(self, batch: int) -> None:
        """Count samples; run epoch ends, step-based controller decisions and checkpoints."""
        self.samples += batch
        self.metrics.sample("step", step=self.step, batch=batch)
        self._steps_since_adjust += 1
        self._steps_since_checkpoint += 1
        while not self.done and self.samples >= (self.epoch + 1) * self.samples_per_epoch:
            self._end_epoch()
        if self.done:
            return
        per_worker = 1 if self.spec.mode == "bsp" else max(1, len(self.members))
        if self.adjust_every is not None and self._steps_since_adjust >= self.adjust_every * per_worker:
            self._adjust()
        if self.checkpoint_every is not None and self._steps_since_checkpoint >= self.checkpoint_every:
            self._checkpoint()

    def _end_epoch(self) -> None:
        now = self.clock()
        self.epoch += 1
        elapsed = now - (self._epoch_start_time or now)
        samples = self.samples - self._epoch_start_samples
        self.metrics.write(
            "epoch",
            epoch=self.epoch,
            step=self.step,
            wall_s=round(now - (self._start_time or now), 3),
            samples_per_s=round(samples / elapsed, 2) if elapsed > 0 else None,
            batch_sizes=self.controller.plan(),
            compute_ms={
                m.name: round(sum(m.epoch_compute_ms) / len(m.epoch_compute_ms), 3)
                for m in self.members.values()
                if m.epoch_compute_ms
            },
            updates={m.name: m.epoch_updates for m in self.members.values()},
            balance=self.spec.balance,
        )
        for m in self.members.values():
            m.epoch_updates = 0
            m.epoch_compute_ms = []
        self._epoch_start_time, self._epoch_start_samples = now, self.samples
        self._submit_eval(self.epoch)
        self.store.set_lr(self.spec.lr_at(self.epoch))
        if self.epoch >= self.spec.epochs:
            self._finish("finished")
            return
        if self.adjust_every is None:
            self._adjust()
        if self.checkpoint_every is None:
            self._checkpoint()

    def _adjust(self) -> None:
        before, smoothed = self.controller.plan(), self.controller.smoothed_ms()
        after = self.controller.adjust()
        self._steps_since_adjust = 0
        self._log_adjust(changed=after != before, smoothed=smoothed)

    def _log_adjust(self, changed: bool, smoothed: dict[str, float | None] | None = None) -> None:
        """One `adjust` event: the plan after the decision and the smoothed times it was based on."""
        smoothed = self.controller.smoothed_ms() if smoothed is None else smoothed
        self.metrics.write(
            "adjust",
            step=self.step,
            epoch=self.epoch,
            batch_sizes=self.controller.plan(),
            compute_ms={name: round(t, 3) for name, t in smoothed.items() if t is not None},
            changed=changed,
            adjustments=self.controller.adjustments,
        )

    def _submit_eval(self, epoch: int, wall: float | None = None) -> None:
        if self.evaluator is None:
            return
        wall = self.clock() - (self._start_time or self.clock()) if wall is None else wall
        if self._defer_to_snapshot(functools.partial(self._submit_eval, epoch, wall)):
            return
        snapshot = self.whole_params()

        def done(accuracy: float, loss: float) -> None:
            self.last_accuracy, self.last_loss = accuracy, loss
            self.evaluations.append((epoch, accuracy, loss, wall))
            self.metrics.write("eval", epoch=epoch, accuracy=round(accuracy, 5), loss=round(loss, 5), wall_s=round(wall, 3))

        self.evaluator.submit(snapshot, done)

    # ------------------------------------------------------------- checkpoints
    def checkpoint_state(self) -> dict[str, Any]:
        """A self-contained snapshot of everything needed to resume (tensors cloned)."""
        flat = self.whole_params()
        model, offset = {}, 0
        for entry in self.layout.entries:
            model[entry.name] = flat[offset : offset + entry.numel].view(entry.shape).clone()
            offset += entry.numel
        return {
            "format": CHECKPOINT_FORMAT,
            "spec": self.spec.to_json(),
            "model": model,
            "params": flat,
            "optimizer": self._whole_optimizer_state(),
            "controller": self.controller.state_dict(),
            "round": self.round,
            "version": self.version,
            "epoch": self.epoch,
            "samples": self.samples,
        }

    def restore(self, state: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
        """Load a checkpoint before the job starts; workers then rejoin. Returns the controller
        settings that differ from the checkpoint's, {field: (checkpoint's, this server's)}: this
        server's apply."""
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"checkpoint format {state.get('format')!r} is not {CHECKPOINT_FORMAT}")
        saved = json.loads(state["spec"])
        current = json.loads(self.spec.to_json())
        # neither the transport (allreduce or not) nor what the controller balances is part of the job's
        # math: a job may resume with either changed
        differ = sorted(k for k in current if saved.get(k) != current[k] and k not in ("allreduce", "balance"))
        if differ:
            raise ValueError(f"the checkpoint was written for a different job: {', '.join(differ)} differ; "
                             "start the server with the job's original flags")
        controller = BatchController.from_state_dict(state["controller"])
        if self.shards is None:
            self.store.load_state_dict({"params": state["params"], "optimizer": state["optimizer"]})
        else:
            start, stop = self.shards.own
            own = slice_optimizer_state(state["optimizer"], self.layout.numel, start, stop)
            self.store.load_state_dict({"params": state["params"][start:stop], "optimizer": own})
            self._shard_state = (state["params"], state["optimizer"])
        self.round, self.version = int(state["round"]), int(state["version"])
        self.epoch, self.samples = int(state["epoch"]), int(state["samples"])
        self._epoch_start_samples = self.samples
        self.store.set_lr(self.spec.lr_at(self.epoch))
        self._saved_controller = controller
        changes = config_changes(controller.config, self.controller.config)
        self.metrics.write(
            "resume", step=self.step, epoch=self.epoch, round=self.round, version=self.version,
            params_sha256=params_digest(state["params"]),
            controller_changes={name: list(pair) for name, pair in changes.items()},
        )
        return changes

    def _checkpoint(self) -> None:
        self._steps_since_checkpoint = 0
        on_checkpoint = self.on_checkpoint
        if on_checkpoint is None:
            return

        def save() -> None:
            on_checkpoint(self.checkpoint_state(), self.step)

        if not self._defer_to_snapshot(save):
            save()

    # ------------------------------------------------------------ end of the job
    def _finish(self, reason: str) -> None:
        self.done = True
        self.reason = reason
        self._end_time = self.clock()
        self.metrics.write("end", reason=reason, step=self.step, epoch=self.epoch)
        self._defer_to_snapshot(lambda: None)  # allreduce: the final global model, for the last checkpoint
        for member in self.membership.pending.values():
            member.activated.set()

    def stop(self, reason: str = "stopping") -> None:
        """Graceful shutdown: abort the open round (its partial gradient is dropped) and tell
        every worker on its next call that the job is stopping."""
        if self.done:
            return
        if self._accumulator is not None:
            self._accumulator.reset()
        self._round_batch = 0
        self._pushed.clear()
        self._finish(reason)
        self._resolve_round()
        self._check_finished()

    def _check_finished(self) -> None:
        if self.done and set(self.members) <= self._told_done and not (self._snapshot_requested and self.members):
            self._finished.set()

    def note_reply_sent(self) -> None:
        """Called after a reply is delivered; the job finishes once every worker was told it is done."""
        self._check_finished()

    async def wait_finished(self, grace_s: float) -> None:
        """Wait until the job is done and every worker has heard so (or grace_s after done)."""
        while not self.done:
            await asyncio.sleep(0.05)
        self._check_finished()
        try:
            await asyncio.wait_for(self._finished.wait(), timeout=grace_s)
        except TimeoutError:
            pass

    def summary(self) -> dict[str, Any]:
        end = self._end_time or self.clock()
        wall = end - (self._start_time or end)
        return {
            "mode": self.spec.mode,
            "controller": self.controller.config.policy,
            "balance": self.spec.balance,  # what the compute_ms the workers reported measure
            "allreduce": self.spec.allreduce,  # the collective fast path (chosen, or picked by --allreduce auto)
            "epochs": self.epoch,
            "rounds": self.round,
            "updates": self.version,
            "wall_s": round(wall, 3),
            "samples_per_s": round(self.samples / wall, 2) if wall > 0 else None,
            "accuracy": self.last_accuracy,
            "loss": self.last_loss,
            "adjustments": self.controller.adjustments,
            "batch_sizes": self.controller.plan(),
            "update_counts": {m.name: m.updates for m in self.members.values()},
            "reason": self.reason,
        }

    def status(self) -> dict[str, Any]:
        smoothed = self.controller.smoothed_ms()
        plan = self.controller.plan()
        return {
            "mode": self.spec.mode,
            "controller": self.controller.config.policy,
            "round": self.round,
            "version": self.version,
            "epoch": self.epoch,
            "epochs": self.spec.epochs,
            "done": self.done,
            "global_batch": sum(plan.values()),
            "adjustments": self.controller.adjustments,
            "last_accuracy": self.last_accuracy,
            "expected_workers": self.spec.workers,
            "path": "auto" if self.may_take_fast_path else "allreduce" if self.spec.allreduce else "ps",
            "workers": [
                {
                    "worker_id": m.worker_id,
                    "name": m.name,
                    "cores": m.cores,
                    "batch_size": plan.get(m.name, 0),
                    "compute_ms": smoothed.get(m.name) or 0.0,
                    "updates": m.updates,
                    "mean_staleness": m.staleness_sum / m.updates if m.updates else 0.0,
                }
                for m in self.members.values()
            ],
        }

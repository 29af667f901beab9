"""The server's core: membership, BSP rounds / ASP updates, epochs, the controller, evaluation.

It speaks in plain Python values (no gRPC): the servicer decodes a request, calls one method
here, and encodes what comes back. Every method validates before it mutates, so a refused
request (a ServiceError) leaves the parameters, the round and the controller as they were.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from dataclasses import dataclass, field

import torch

from ps.aggregation import WeightedMean, asp_lr
from ps.controller import BatchController
from ps.datasets import Dataset
from ps.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from ps.evaluator import BackgroundEvaluator
from ps.jobspec import JobSpec
from ps.metrics import MetricsLog
from ps.store import ParameterStore
from ps.wire import FlatReceiver, Layout, check_wire_dtype, encode, split

MAX_COMPUTE_MS = 24 * 3600 * 1000.0


@dataclass
class Member:
    """A joined worker and its counters."""

    worker_id: str
    name: str
    cores: float
    index: int
    updates: int = 0
    staleness_sum: int = 0
    epoch_updates: int = 0
    epoch_compute_ms: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class PushMeta:
    """The header of a push, as the core sees it."""

    worker_id: str
    round: int
    version: int
    batch_size: int
    compute_ms: float
    wire_dtype: str
    num_values: int


@dataclass(frozen=True)
class JoinInfo:
    worker_id: str
    index: int
    batch_size: int
    round: int
    version: int
    epoch: int


@dataclass(frozen=True)
class StepReply:
    """What a worker needs for its next step; payload is the encoded parameters."""

    round: int
    version: int
    epoch: int
    batch_size: int
    done: bool
    lr: float
    global_batch: int
    wire_dtype: str
    num_values: int
    payload: list[bytes]


@dataclass
class _RoundResult:
    payload: list[bytes]
    round: int
    epoch: int
    done: bool


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
        metrics: MetricsLog | None = None,
        evaluator: BackgroundEvaluator | None = None,
    ) -> None:
        self.spec = spec
        self.controller = controller
        self.layout = Layout.of(model)
        self.store = ParameterStore(model, spec)
        self.samples_per_epoch = len(dataset.train_x)
        self.adjust_every = adjust_every
        self.max_staleness = max_staleness
        self.metrics = metrics or MetricsLog(None)
        self.evaluator = evaluator
        self.members: dict[str, Member] = {}
        self.round = 0
        self.version = 0
        self.epoch = 0
        self.samples = 0
        self.done = False
        self.last_accuracy: float | None = None
        self.last_loss: float | None = None
        self.evaluations: list[tuple[int, float, float, float]] = []
        self._joined = 0
        self._started = asyncio.Event()
        self._finished = asyncio.Event()
        self._start_time: float | None = None
        self._end_time: float | None = None
        self._epoch_start_time: float | None = None
        self._epoch_start_samples = 0
        self._told_done: set[str] = set()
        self._accumulator = WeightedMean(self.layout.numel) if spec.mode == "bsp" else None
        self._pushed: set[str] = set()
        self._round_future: asyncio.Future[_RoundResult] | None = None
        self._staging: list[torch.Tensor] = []
        self._payload_cache: tuple[int, list[bytes]] | None = None
        self._asp_steps_since_adjust = 0

    # ----------------------------------------------------------------- membership
    async def join(self, name: str, cores: float) -> JoinInfo:
        """Register a worker; returns once all expected workers have joined."""
        if not name or len(name) > 128:
            raise InvalidArgument("name must be 1-128 characters")
        if not (math.isfinite(cores) and 0 < cores <= 1e6):
            raise InvalidArgument(f"cores must be a finite number > 0, got {cores}")
        if self.done:
            raise FailedPrecondition("the job has ended")
        if self._started.is_set() or len(self.members) >= self.spec.workers:
            raise FailedPrecondition(f"job full: all {self.spec.workers} workers have joined")
        if any(m.name == name for m in self.members.values()):
            raise AlreadyExists(f"a worker named {name!r} has already joined; pick another --name")
        worker_id = f"{name}-{secrets.token_hex(4)}"
        member = Member(worker_id, name, cores, self._joined)
        self._joined += 1
        self.members[worker_id] = member
        self.controller.add_worker(worker_id, cores=cores)
        if len(self.members) == self.spec.workers:
            self.controller.replan()
            self._log_adjust(changed=True)
            self._start_time = self._epoch_start_time = time.monotonic()
            self._started.set()
        try:
            await self._started.wait()
        except asyncio.CancelledError:
            # the caller gave up (deadline, crash) before the job started: free its slot and name
            if not self._started.is_set() and worker_id in self.members:
                del self.members[worker_id]
                self.controller.remove_worker(worker_id)
            raise
        return JoinInfo(worker_id, member.index, self.controller.plan()[worker_id], self.round, self.version, self.epoch)

    def member(self, worker_id: str) -> Member:
        member = self.members.get(worker_id)
        if member is None:
            raise NotFound(f"unknown worker id {worker_id!r}; Join first")
        return member

    async def leave(self, worker_id: str) -> None:
        """Remove a worker; a BSP round that only waited on it closes with the others."""
        self.member(worker_id)
        del self.members[worker_id]
        self._told_done.discard(worker_id)
        if self.done:
            self._check_finished()
            return
        self.controller.remove_worker(worker_id)
        if self.members:
            self.controller.replan()
            self._log_adjust(changed=True)
        self._pushed.discard(worker_id)
        if self._accumulator is not None and self._accumulator.count and self._pushed >= set(self.members):
            self._close_round()
        if not self.members:
            self._check_finished()

    # ---------------------------------------------------------------------- push
    def begin_push(self, meta: PushMeta) -> FlatReceiver:
        """Validate a push header and hand back a receiver for its payload."""
        member = self.member(meta.worker_id)
        check_wire_dtype(meta.wire_dtype)
        if meta.batch_size <= 0:
            raise InvalidArgument(f"batch size must be > 0, got {meta.batch_size}")
        limit = max(self.spec.global_batch, max(self.controller.plan().values(), default=0))
        if meta.batch_size > limit:
            raise InvalidArgument(f"batch size {meta.batch_size} exceeds the global batch {limit}")
        if not (math.isfinite(meta.compute_ms) and 0 <= meta.compute_ms <= MAX_COMPUTE_MS):
            raise InvalidArgument(f"compute_ms must be finite and in [0, {MAX_COMPUTE_MS:.0f}], got {meta.compute_ms}")
        if meta.num_values != self.layout.numel:
            raise InvalidArgument(f"buffer has {meta.num_values} values, the layout expects {self.layout.numel}")
        if not self._started.is_set():
            raise FailedPrecondition("the job has not started: waiting for workers to join")
        self._check_sequence(member, meta)
        buffer = self._staging.pop() if self._staging else torch.empty(self.layout.numel)
        return FlatReceiver(buffer, meta.num_values, meta.wire_dtype)

    def release(self, receiver: FlatReceiver) -> None:
        """Return a receiver's buffer to the pool (after success or failure)."""
        self._staging.append(receiver.out)

    def _check_sequence(self, member: Member, meta: PushMeta) -> None:
        if self.spec.mode == "bsp":
            if meta.round != self.round:
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

    async def push(self, meta: PushMeta, values: torch.Tensor) -> StepReply:
        """Apply a validated push; BSP returns once the round closes, ASP at once."""
        member = self.member(meta.worker_id)
        self._check_sequence(member, meta)
        if self.done:
            return self._reply(member, self._current_payload(), done=True)
        if self.spec.mode == "bsp":
            return await self._push_bsp(member, meta, values)
        return self._push_asp(member, meta, values)

    async def _push_bsp(self, member: Member, meta: PushMeta, grad: torch.Tensor) -> StepReply:
        assert self._accumulator is not None
        self.controller.observe(member.worker_id, meta.batch_size, meta.compute_ms)
        self._accumulator.add(grad, meta.batch_size)
        self._record(member, meta)
        self._pushed.add(member.worker_id)
        if self._round_future is None:
            self._round_future = asyncio.get_running_loop().create_future()
        future = self._round_future
        if self._pushed >= set(self.members):
            self._close_round()
        result = await asyncio.shield(future)
        return self._reply(member, result.payload, done=result.done)

    def _close_round(self) -> None:
        assert self._accumulator is not None
        self.store.apply_gradient(self._accumulator.result())
        batch = self._accumulator.weight
        self._accumulator.reset()
        self._pushed.clear()
        self.round += 1
        self.version += 1
        self._advance(batch, step=self.round)
        result = _RoundResult(self._current_payload(), self.round, self.epoch, self.done)
        future, self._round_future = self._round_future, None
        if future is not None and not future.done():
            future.set_result(result)

    def _push_asp(self, member: Member, meta: PushMeta, delta: torch.Tensor) -> StepReply:
        self.controller.observe(member.worker_id, meta.batch_size, meta.compute_ms)
        self.store.apply_update(delta)
        member.staleness_sum += self.version - meta.version
        self.version += 1
        self._record(member, meta)
        self._asp_steps_since_adjust += 1
        self._advance(meta.batch_size, step=self.version)
        return self._reply(member, self._current_payload(), done=self.done)

    def _record(self, member: Member, meta: PushMeta) -> None:
        member.updates += 1
        member.epoch_updates += 1
        member.epoch_compute_ms.append(meta.compute_ms)

    # -------------------------------------------------------------- pull / reply
    def pull(self, worker_id: str) -> StepReply:
        member = self.member(worker_id)
        return self._reply(member, self._current_payload(), done=self.done)

    def _current_payload(self) -> list[bytes]:
        if self._payload_cache is None or self._payload_cache[0] != self.version:
            self._payload_cache = (self.version, split(encode(self.store.flat, self.spec.wire_dtype)))
        return self._payload_cache[1]

    def _reply(self, member: Member, payload: list[bytes], done: bool) -> StepReply:
        plan = self.controller.plan()
        batch = plan.get(member.worker_id, 0)
        global_batch = sum(plan.values())
        lr = asp_lr(self.spec.lr_at(self.epoch), batch, global_batch, self.spec.lr_scaling) if batch else 0.0
        if done:
            self._told_done.add(member.worker_id)
        return StepReply(
            round=self.round,
            version=self.version,
            epoch=self.epoch,
            batch_size=batch,
            done=done,
            lr=lr if self.spec.mode == "asp" else self.spec.lr_at(self.epoch),
            global_batch=global_batch,
            wire_dtype=self.spec.wire_dtype,
            num_values=self.layout.numel,
            payload=payload,
        )

    # ------------------------------------------------------- epochs and control
    def _advance(self, batch: int, step: int) -> None:
        """Count samples; run epoch ends and step-based controller decisions."""
        self.samples += batch
        while not self.done and self.samples >= (self.epoch + 1) * self.samples_per_epoch:
            self._end_epoch(step)
        if self.done or self.adjust_every is None:
            return
        if self.spec.mode == "bsp" and self.round % self.adjust_every == 0:
            self._adjust(step)
        elif self.spec.mode == "asp" and self._asp_steps_since_adjust >= self.adjust_every * max(1, len(self.members)):
            self._adjust(step)

    def _end_epoch(self, step: int) -> None:
        now = time.monotonic()
        self.epoch += 1
        elapsed = now - (self._epoch_start_time or now)
        samples = self.samples - self._epoch_start_samples
        self.metrics.write(
            "epoch",
            epoch=self.epoch,
            step=step,
            wall_s=round(now - (self._start_time or now), 3),
            samples_per_s=round(samples / elapsed, 2) if elapsed > 0 else None,
            batch_sizes=self._by_name(self.controller.plan()),
            compute_ms={
                m.name: round(sum(m.epoch_compute_ms) / len(m.epoch_compute_ms), 3)
                for m in self.members.values()
                if m.epoch_compute_ms
            },
            updates={m.name: m.epoch_updates for m in self.members.values()},
        )
        for m in self.members.values():
            m.epoch_updates = 0
            m.epoch_compute_ms = []
        self._epoch_start_time, self._epoch_start_samples = now, self.samples
        self._submit_eval(self.epoch)
        self.store.set_lr(self.spec.lr_at(self.epoch))
        if self.epoch >= self.spec.epochs:
            self.done = True
            self._end_time = now
            return
        if self.adjust_every is None:
            self._adjust(step)

    def _adjust(self, step: int) -> None:
        before, smoothed = self.controller.plan(), self.controller.smoothed_ms()
        after = self.controller.adjust()
        self._asp_steps_since_adjust = 0
        self._log_adjust(changed=after != before, step=step, smoothed=smoothed)

    def _log_adjust(self, changed: bool, step: int | None = None, smoothed: dict[str, float | None] | None = None) -> None:
        """One `adjust` event: the plan after the decision and the smoothed times it was based on."""
        smoothed = self.controller.smoothed_ms() if smoothed is None else smoothed
        self.metrics.write(
            "adjust",
            step=self.round if self.spec.mode == "bsp" else self.version if step is None else step,
            epoch=self.epoch,
            batch_sizes=self._by_name(self.controller.plan()),
            compute_ms={self.members[w].name: round(t, 3) for w, t in smoothed.items() if t is not None and w in self.members},
            changed=changed,
            adjustments=self.controller.adjustments,
        )

    def _by_name(self, values: dict[str, int]) -> dict[str, int]:
        return {self.members[w].name: v for w, v in values.items() if w in self.members}

    def _submit_eval(self, epoch: int) -> None:
        if self.evaluator is None:
            return
        snapshot = self.store.snapshot()
        wall = time.monotonic() - (self._start_time or time.monotonic())

        def done(accuracy: float, loss: float) -> None:
            self.last_accuracy, self.last_loss = accuracy, loss
            self.evaluations.append((epoch, accuracy, loss, wall))
            self.metrics.write("eval", epoch=epoch, accuracy=round(accuracy, 5), loss=round(loss, 5), wall_s=round(wall, 3))

        self.evaluator.submit(snapshot, done)

    # ------------------------------------------------------------ end of the job
    def _check_finished(self) -> None:
        if self.done and (not self.members or set(self.members) <= self._told_done):
            self._finished.set()

    def note_reply_sent(self) -> None:
        """Called after a reply is delivered; the job finishes once every worker was told it is done."""
        self._check_finished()

    async def wait_finished(self, grace_s: float) -> None:
        """Wait until the job is done and every worker has heard so (or grace_s after done)."""
        while not self.done:
            await asyncio.sleep(0.05)
        try:
            await asyncio.wait_for(self._finished.wait(), timeout=grace_s)
        except TimeoutError:
            pass

    def summary(self) -> dict:
        end = self._end_time or time.monotonic()
        wall = end - (self._start_time or end)
        return {
            "mode": self.spec.mode,
            "controller": self.controller.config.policy,
            "epochs": self.epoch,
            "rounds": self.round,
            "updates": self.version,
            "wall_s": round(wall, 3),
            "samples_per_s": round(self.samples / wall, 2) if wall > 0 else None,
            "accuracy": self.last_accuracy,
            "loss": self.last_loss,
            "adjustments": self.controller.adjustments,
            "batch_sizes": self._by_name(self.controller.plan()),
            "update_counts": {m.name: m.updates for m in self.members.values()},
        }

    def status(self) -> dict:
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
            "workers": [
                {
                    "worker_id": m.worker_id,
                    "name": m.name,
                    "cores": m.cores,
                    "batch_size": plan.get(m.worker_id, 0),
                    "compute_ms": smoothed.get(m.worker_id) or 0.0,
                    "updates": m.updates,
                    "mean_staleness": m.staleness_sum / m.updates if m.updates else 0.0,
                }
                for m in self.members.values()
            ],
        }


"""A worker's steps, one after another: the batch fetched and its compute timed, the gradient
pushed (in buckets during backward, or whole after it; ASP: the local optimizer's update; the fast
path: all-reduced with the group; on probation, a probe: whole to the coordinator, whatever the path),
the reply's plan followed and its parameters in the model.

In BSP on the PS path the gradient goes out in buckets while backward runs (worker/paths/overlap.py);
step() closes that push and waits for the reply's header: the parameters go on arriving, first
layers first, while the next batch is drawn and its forward runs, each module waiting for its own
(worker/paths/forward_order.py; wait_params() waits for them all). A failed push or reply drops the
step's gradient and recovers (worker/session/replica.py)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from functools import partial

import torch

from common.transport.layout import flatten_grads
from common.transport.messages import PushMeta, PushTimes, StepHeader
from worker.data.slices import TrainedLog
from worker.device import synchronize
from worker.paths.local_optimizer import StepRefused
from worker.paths.overlap import Stream
from worker.probes.resources import SlowerMachine
from worker.session.collective_step import CollectiveStep
from worker.session.plan_follower import PlanFollower
from worker.session.replica import Replica
from worker.session.sub_batch import SubBatch
from worker.timing.step_timer import StepTimer
from worker.transport.call_bounds import MIN_PARKED_POLL_S
from worker.transport.cancelled_push import after_cancelled_stream
from worker.transport.client import ServerError
import worker.transport.server_checks as server_checks

log = logging.getLogger(__name__)


class StepRunner:
    """The steps of one session, on `machine` (the worker's own, or a slower one emulated)."""

    def __init__(self, replica: Replica, follower: PlanFollower, machine: SlowerMachine) -> None:
        self._replica, self._follower = replica, follower
        self.timer = StepTimer(machine.around(self._end_compute))
        self._collective = CollectiveStep(replica, follower)
        self._trained = TrainedLog(replica.member.name)  # the audit hook: what each taken push trained on
        self.steps = 0
        self.last_compute_ms = 0.0
        self.parked_polls = 0  # long polls answered while parked
        self.streamed_replies = 0  # replies whose parameters streamed in while the next forward ran
        self._streamed = False  # whether the last step's reply streamed in (during this step's forward)
        self._drawn = 0  # the size of the batch the next step's gradients come from
        self._drawn_step: tuple[StepHeader, torch.Tensor] | None = None  # and its plan and indices
        self._probing = False  # the batch drawn is a probe's (ps.rounds.probation)
        self.sub_batch = SubBatch()  # the drawn batch's part whose gradient norm the push carries
        self._refused = 0  # ASP: local steps refused in a row (each could overflow fp32)

    def _end_compute(self, started_s: float, started_cpu_s: float) -> float:
        """The device's work done; the forward's wait for parameters, which is exposed, not compute."""
        synchronize(self._replica.device)
        return self._replica.parts.arrivals.take_waited_ms()

    def _meta(self, times: PushTimes) -> PushMeta:
        """The header of this step's push on the PS path."""
        plan, spec = self._follower.plan, self._replica.spec
        sub_batch, sub_sq_norm = self.sub_batch.measured
        return PushMeta(self._replica.member.worker_id, plan.round, plan.version, self._follower.sampler.batch_size,
                        times, spec.wire_dtype, sub_batch=sub_batch, sub_sq_norm=sub_sq_norm)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch of the planned size; this step's compute starts."""
        replica = self._replica
        own_from_cpu = replica.parts.collective is not None and replica.device.type == "cpu"
        self.timer.fetch_begins(self.steps, own_from_cpu)
        x, y = self._follower.draw()
        self.timer.batch_drawn(self._follower.wait_ms)
        self._drawn, self._drawn_step = len(y), self._follower.drawn()
        self._probing = self._follower.plan.probe
        self.sub_batch.draw(replica.spec, self._follower.plan, self._drawn,
                            ps_path=replica.parts.collective is None and not self._probing)
        if replica.parts.buckets is not None:
            if self._probing:  # a probe goes whole to the coordinator after backward
                replica.parts.buckets.disarm()
            else:
                replica.parts.buckets.arm(self._open_push)
        return x, y

    def _open_push(self) -> Stream:
        """This step's bucketed push (opened by the first bucket backward completes; its times go at its end)."""
        return self._replica.member.client.open_push(self._meta(PushTimes()), self._replica.parts.params)

    @contextlib.contextmanager
    def paused_push(self) -> Iterator[None]:
        """Within: a backward sends no bucket (a first pass over part of the batch); the step's
        bucketed push resumes after it, with the gradients the next pass accumulates."""
        buckets = self._replica.parts.buckets
        if buckets is None or self._probing or not self.timer.computing:
            yield
            return
        buckets.disarm()
        try:
            yield
        finally:
            buckets.arm(self._open_push)

    def step(self) -> StepHeader:
        """Push this step's gradients; return once the new parameters are in the model (or streaming in)."""
        if not self.timer.computing:
            raise RuntimeError("step() called without a batch: use batches() or next_batch() first")
        replica, timer = self._replica, self.timer
        timer.compute_ends()
        if replica.parts.forward is not None:
            replica.parts.forward.check_step(self._streamed)
        if not self.settle_params():  # the last reply failed while it streamed: this step's gradient is dropped
            return self._follower.plan
        times = timer.times(replica.spec)
        parts = replica.parts
        if self._probing:
            return self._finish(lambda: self._probe(times))
        stream = parts.buckets.finish() if parts.buckets is not None else None
        if stream is not None:  # the buckets are out (or going): close the push; the reply below
            arrivals = parts.arrivals if parts.forward is not None else None
            return self._finish(lambda: stream.end(times, arrivals)(), timer.compute_end, streamed=arrivals is not None)
        if parts.on_device is None:
            grads = device_grads = flatten_grads(replica.model, parts.grads)
        else:  # the collective takes them where they are (NCCL: no trip through the CPU); the wire from the CPU
            device_grads = flatten_grads(replica.model, parts.on_device[1])
            grads = parts.grads if parts.collective is not None else parts.grads.copy_(device_grads)
        values = grads
        if replica.optimizer is not None:
            try:
                values = replica.optimizer.update(grads, self._follower.plan.lr)
                self._refused = 0
            except StepRefused as exc:
                self._refused += 1
                server_checks.local_steps(self._refused, self._follower.plan.lr)
                log.warning("%s: %s; the batch is dropped", replica.member.name, exc)
                plan = replica.pull()
                self._follower.apply(plan)
                return plan
        if parts.collective is not None:
            return self._finish(lambda: self._collective.push(device_grads, times, self._drawn, self._push))
        return self._finish(lambda: self._push(values, times))

    def _push(self, values: torch.Tensor, times: PushTimes) -> StepHeader:
        """The PS path's push of a whole gradient (ASP: update); the reply's parameters land in the flat ones."""
        parts = self._replica.parts
        push = partial(self._replica.member.client.push, self._meta(times), values, parts.params)
        return after_cancelled_stream(push) if parts.buckets is not None else push()

    def _probe(self, times: PushTimes) -> StepHeader:
        """On probation: the whole gradient to the coordinator, whatever the job's path (the group's
        collective and the shards are the job's once the reply says this worker is in the plan)."""
        replica = self._replica
        parts = replica.parts
        if parts.on_device is None:
            grads = flatten_grads(replica.model, parts.grads)
        else:
            grads = parts.grads.copy_(flatten_grads(replica.model, parts.on_device[1]))
        return replica.member.client.push_probe(self._meta(times), grads, parts.params)

    def _finish(self, push: Callable[[], StepHeader | None], pushed: float | None = None,
                streamed: bool = False) -> StepHeader:
        """Run `push` (from `pushed`, default now: where this worker's own part of it begins), or
        recover from its failure; the new parameters into the model, the plan followed. A push that
        returns None took no step (the plan it settled stands, the model holds its parameters).
        `streamed`: the push returns at its reply's header, the parameters streaming in after it."""
        pushed = time.perf_counter() if pushed is None else pushed
        replica, follower = self._replica, self._follower
        self._streamed = False
        try:
            plan = push()
            if plan is None:
                return follower.plan
        except ServerError as exc:
            plan = replica.recover(exc, follower.plan)
        else:
            self.steps += 1
            self.last_compute_ms = self.timer.compute_ms
            self._trained.write(self._drawn_step, replica.member.worker_id)
            self._streamed = streamed
            self.streamed_replies += streamed
        if self._streamed:  # the model's parameters are views of the flat ones: they fill in as chunks land
            follower.follow(plan)
            if plan.done:
                self.settle_params(job_done=True)
        else:
            follower.apply(plan)
        if replica.parts.collective is None:  # the fast path's is taken at the next fetch (worker/timing/own_time.py)
            self.timer.push_ended(replica.member.client.last_push, pushed)
        return follower.plan

    def settle_params(self, job_done: bool = False) -> bool:
        """Wait for a reply still streaming parameters in; False if it failed: the gradient computed
        meanwhile is dropped, and the worker recovered (resync or rejoin, as after a failed push).
        `job_done`: the reply said the job ended; a failure then ends the wait and nothing is
        recovered. A stop drops the open round (ps/rounds/parts.py): with --shards no shard commits
        it, so the shards' parts of the reply never come and their calls fail as the server stops
        its shards; the model keeps the shards' ranges of the last committed round, which is the
        round the coordinator's range 0 holds too."""
        parts = self._replica.parts
        try:
            parts.arrivals.wait_all()
        except ServerError as exc:
            if parts.buckets is not None:
                parts.buckets.disarm()
            self.timer.drop()
            if not job_done:
                self._follower.apply(self._replica.recover(exc, self._follower.plan))
            return False
        return True

    def wait_parked(self) -> StepHeader:
        """Parked: wait in the server's long poll until it plans this worker a batch (or the job ends),
        then pull the parameters; the plan."""
        replica, follower = self._replica, self._follower
        self.timer.parked()
        if not self.settle_params():
            return follower.plan
        try:
            asked = time.monotonic()
            plan = replica.pull(header_only=True, wait_for_batch=True)
            self.parked_polls += 1
            if plan.batch_size > 0 and not plan.done:
                plan = replica.pull()
                follower.apply(plan)
            else:
                follower.follow(plan)
                if not plan.done:  # still parked: the next poll no sooner than MIN_PARKED_POLL_S after this one
                    time.sleep(max(0.0, asked + MIN_PARKED_POLL_S - time.monotonic()))
        except ServerError as exc:
            follower.apply(replica.recover(exc, follower.plan))
        return follower.plan

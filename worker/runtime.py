"""The worker runtime as a library: join, iterate batches sized by the server's plan, step.

A custom training loop needs three calls::

    from worker import connect
    import torch.nn.functional as F

    with connect("127.0.0.1:50051", name="w0") as session:
        model = session.model
        for x, y in session.batches():          # sizes follow the server's plan
            loss = F.cross_entropy(model(x), y)
            model.zero_grad()
            loss.backward()
            session.step()                       # returns once the reply's header is in

Compute time (data fetch, forward, backward; the wait for the loader is also sent apart) runs from
the moment a batch is fetched until step() is called; it is what the server's batch policy balances.
In BSP on the PS path the gradient goes out in buckets while backward runs (worker/paths/overlap.py);
step() closes that push and waits for the reply's header: the parameters go on arriving, first
layers first, while the next batch is drawn and its forward runs, each module waiting for its own
(worker/paths/forward_order.py; wait_params() waits for them all, and so does the model's state_dict()).
From a compute's end to the next fetch, plus what the forward waited, is the step's exposed
communication. With --allreduce, step() all-reduces with the group and steps a local optimizer.

A worker the server parks (BSP, `--policy model`: batch 0, the round is shorter without it) gets no
batches until it is planned one; it waits in a long poll and pulls the parameters before computing."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from functools import partial

import torch
from torch import nn
from torch.utils.data import Dataset as TorchDataset

from common.job.datasets import TrainingData
from common.job.spec import JobSpec
from common.transport.layout import Layout, flatten_grads, flatten_params, load_flat
from common.transport.messages import PushMeta, PushTimes, StepHeader
import worker.transport.server_checks as server_checks
from worker.transport.bucket_stream import BucketStream
from worker.transport.cancelled_push import after_cancelled_stream
from worker.transport.client import LEAVE_TIMEOUT_S, Joined, PSClient, ServerError
from worker.paths.collective import CollectiveError
from worker.device import gpu_uuid, synchronize
from worker.paths.group_store import ServerStore
from worker.transport.heartbeat import Heartbeat
from worker.data.loader import Batches, LoaderOptions
from worker.paths.local_optimizer import LocalOptimizer, StepRefused
from worker.data.job_build import BuiltJob, build_job
from worker.paths.path_parts import PathParts, ProcessSession
from worker.timing.own_time import OwnTime, push_own_ms
from worker.transport.reconnect import rejoin_with_backoff
from worker.paths.regroup import await_regroup, generation_stands
from worker.probes.cpu_parts import PROBE
from worker.probes.resources import burn_cpu, slowdown_delay
from worker.data.sampler import ElasticBatchSampler
from worker.data.slices import OwnData, SliceSource, TrainedLog

log = logging.getLogger(__name__)


class Session:
    """One worker's membership in a job: its model, data, batch size and step()."""

    def __init__(
        self, client: PSClient, name: str, cores: float, slowdown: float = 1.0, retry_for: float = 120.0,
        device: torch.device | None = None, step_overhead_ms: float = 0.0, max_batch: int = 0,
        pass_samples: int | None = None, overlap: bool = True, built: BuiltJob | None = None,
        loader: LoaderOptions = LoaderOptions(), data: OwnData | None = None,
        allowed_imports: Sequence[str] = (),
    ) -> None:
        if not slowdown >= 1.0:
            raise ValueError(f"slowdown must be >= 1, got {slowdown}")
        if not 0.0 <= step_overhead_ms < float("inf"):
            raise ValueError(f"step_overhead_ms must be a finite number >= 0, got {step_overhead_ms}")
        self.client = client
        self.slowdown = slowdown
        self.step_overhead_ms = step_overhead_ms
        self.cores = cores
        self.retry_for = retry_for
        self._overlap_wanted = overlap  # unless the job says --no-overlap (set up in _path_parts)
        self.device = device or torch.device("cpu")
        self.rejoins = 0
        self.closed = False  # set by close(): whether the connection closed (see PSClient.close)
        self.max_batch, self.pass_samples = max_batch, pass_samples  # (worker/data/memory_probe.py)
        self._loader, self.data_wait_ms = loader, 0.0  # how batches are read (worker/data/loader.py); the last one's wait
        self._built, self._own = built, data  # the job the memory probe built (not built twice); the user's data
        self.allowed_imports = tuple(allowed_imports)  # modules a job's factory path may come from (worker.data.job_build)
        self._counted = ProcessSession()
        client.switch_paths = self._counted.only
        try:
            joined = client.join(name, cores, cuda_device=gpu_uuid(self.device), max_batch=max_batch)
        except BaseException:
            self._counted.close()
            raise
        self.name = name
        self.worker_id = joined.worker_id
        # beat from the start: building the data and the model can take longer than --evict-after
        self._heartbeat = Heartbeat(client.heartbeat, self.worker_id, joined.heartbeat_interval_s)
        try:
            self._setup(joined)
        except BaseException:
            self._heartbeat.stop()
            self._counted.close()
            with contextlib.suppress(ServerError):  # a member that will never push: BSP peers need not wait --evict-after
                client.leave(self.worker_id)
            raise
        self._fetch_started: float | None = None
        self._fetch_cpu = 0.0
        self._drawn = 0  # the size of the batch the next step's gradients come from
        self._drawn_step: tuple[StepHeader, torch.Tensor] | None = None  # and its plan and indices
        self._report: Callable[[], StepHeader] | None = None  # the fast path's last report, its reply not yet read
        self.steps = 0
        self.parked_polls = 0  # long polls answered while parked
        self.last_compute_ms = 0.0
        self._push_ms = 0.0  # the previous push's own part (reported with compute time under --balance busy)
        self._own_time = OwnTime()  # the fast path's, from CPU time
        self._compute_end: float | None = None  # when the last step's compute ended (perf_counter)
        self.exposed_ms = 0.0  # the last step's exposed communication: its compute's end to the next fetch

    def _setup(self, joined: Joined) -> None:
        """Build the job's data and model and load the global parameters. The flat parameters
        (the wire's and the collective's buffer) stay on the CPU; on a GPU the model gets a copy."""
        client = self.client
        self.spec: JobSpec = joined.spec
        built = self._built if self._built is not None and self._built.spec == self.spec else build_job(self.spec, self.allowed_imports)
        self._built = None
        self.dataset: TrainingData = built.dataset
        self.model: nn.Module = built.model
        if Layout.of(self.model) != joined.layout:
            raise ServerError("FAILED_PRECONDITION", "this worker's model does not match the server's parameter layout")
        if self.device.type != "cpu":
            self.model.to(self.device)
        self._parts = self._path_parts(flatten_params(self.model).cpu())
        n = len(self.dataset.train)  # --sampling exact: the server's slices (worker/data/slices.py), else its own draws
        self._sampler = (SliceSource(n, self.spec.seed, self.spec.epochs) if self.spec.exact_epochs
                         else ElasticBatchSampler(n, seed=self.spec.seed * 1009 + joined.index))
        self._trained = TrainedLog(self.name)  # the audit hook: what each step whose push was taken trained on
        train = self.dataset.train if self._own is None else self._own.dataset
        self._batches = Batches(train, self._sampler, self._loader, self.device)
        self._optimizer = LocalOptimizer(self.spec, self._parts.params) if self.spec.mode == "asp" else None
        self._streamed = False  # whether the last step's reply streamed in (during this step's forward)
        self.streamed_replies = 0  # replies whose parameters streamed in while the next forward ran
        self._apply(self._pull_global_model())

    def _path_parts(self, params: torch.Tensor, old: PathParts | None = None) -> PathParts:
        """The parts of the job's path (spec.allreduce) from the flat `params`; `old`, the other path's (a switch), closed first."""
        if old is not None:
            old.close()
        stores = partial(ServerStore, lambda call: self.client.rendezvous(self.worker_id, call))
        return PathParts.build(self.spec, self.model, params, self.device, self._overlap_wanted, stores, self.retry_for)

    def _switch_path(self, plan: StepHeader) -> None:
        """The server switched the path (`plan.path`): onto the fast path from the parameters just loaded, or off it."""
        self._parts.arrivals.wait_all()  # a reply still streaming in: its parameters first
        self.spec = replace(self.spec, allreduce=plan.path == "allreduce")
        self._parts = self._path_parts(self._parts.params, self._parts)
        log.info("%s: the job runs on the %s now", self.name, "collective fast path" if self.spec.allreduce else "PS path")
        self._pull_optimizer_state()

    def _pull_global_model(self) -> StepHeader:
        """The server's parameters, and with --allreduce its optimizer state too (a resumed job's
        momentum: the group starts from this copy when no peer's is further along)."""
        plan = self.client.pull(self.worker_id, self._parts.params)
        self._pull_optimizer_state()
        return plan

    def _pull_optimizer_state(self) -> None:
        """--allreduce: the server's optimizer state (its momentum) into the group's copy; nothing on the PS path."""
        if (collective := self._parts.collective) is not None and collective.state_numel:
            collective.load_optimizer_state(self.client.pull_optimizer_state(self.worker_id, collective.state_numel))

    # ------------------------------------------------------------------ the plan
    def _apply(self, plan: StepHeader) -> None:
        """Load the parameters into the model and follow `plan`."""
        parts = self._parts
        load_flat(self.model, parts.params if parts.on_device is None else parts.on_device[0].copy_(parts.params))
        self._follow(plan)

    def _follow(self, plan: StepHeader) -> None:
        """Take `plan` as the current one, checked: the next batch is drawn at its size (--sampling exact:
        its slice, one clear error if it cannot be trained on; the loader starts reading it now)."""
        server_checks.step_plan(plan, self.max_batch, self.spec.micro_batch)
        renew = (slices := isinstance(self._sampler, SliceSource)) and self._sampler.follow(plan)
        self.plan = plan
        if plan.path and not plan.done and (plan.path == "allreduce") != self.spec.allreduce:
            self._switch_path(plan)
        if plan.batch_size > 0:
            self._sampler.batch_size = plan.batch_size
        if slices:  # the loader starts on what is newly known (renew: after dropping what is not wanted)
            self._batches.renew(plan.batch_size, drop=renew)

    @property
    def batch_size(self) -> int:
        return self.plan.batch_size

    @property
    def epoch(self) -> int:
        return self.plan.epoch

    @property
    def done(self) -> bool:
        return self.plan.done

    # ---------------------------------------------------------------- training
    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch of the planned size; starts this step's compute timer."""
        PROBE.round_begins(self.steps)  # an audit hook for benchmarks (does nothing unless $PS_CPU_PARTS is set)
        self._fetch_started, self._fetch_cpu = time.perf_counter(), time.process_time()
        if self._parts.collective is not None and self.device.type == "cpu":
            self._push_ms = self._own_time.own_ms(self._fetch_cpu)
        if self._compute_end is not None:
            self.exposed_ms = (self._fetch_started - self._compute_end) * 1000.0
            self._compute_end = None
        x, y = self._batches.next(self._sampler.batch_size)
        PROBE.batch_drawn()
        self._drawn, self.data_wait_ms = len(y), self._batches.wait_ms
        self._drawn_step = (self.plan, self._sampler.taken()) if isinstance(self._sampler, SliceSource) else None
        if self._parts.buckets is not None:
            self._parts.buckets.arm(self._open_push)
        return x, y

    def _meta(self, times: PushTimes) -> PushMeta:
        """The header of this step's push on the PS path."""
        return PushMeta(self.worker_id, self.plan.round, self.plan.version, self._sampler.batch_size, times,
                        self.spec.wire_dtype)

    def _open_push(self) -> BucketStream:
        """This step's bucketed push (opened by the first bucket backward completes; its times go at its end)."""
        return self.client.open_push(self._meta(PushTimes()), self._parts.params)

    def batches(self, dataset: TorchDataset | None = None,
                fingerprint: str = "") -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Batches until the server ends the job; call step() after each. While the server parks this
        worker (batch 0) none come: it waits for a batch (wait_parked). `dataset`: your own training set
        instead of the job's, as many samples (worker.data.slices.OwnData; declared at the next Join)."""
        if dataset is not None and (self._own is None or dataset is not self._own.dataset):
            self._own = OwnData.checked(dataset, len(self.dataset.train), fingerprint)
            self.client.declared = self._own.declared()  # for a rejoin
            self._batches.close()
            self._batches = Batches(dataset, self._sampler, self._loader, self.device)
            self._follow(self.plan)  # the plan's slice, read from this dataset now
        self.model.train()
        while not self.done:
            if self.batch_size == 0:
                self.wait_parked()
                continue
            yield self.next_batch()

    def wait_parked(self) -> StepHeader:
        """Parked: wait in the server's long poll until it plans this worker a batch (or the job ends),
        then pull the parameters; the plan."""
        self._compute_end = None  # the wait while parked is no communication a step left exposed
        if not self._settle_params():
            return self.plan
        try:
            plan = self.client.pull(self.worker_id, self._parts.params, header_only=True, wait_for_batch=True)
            self.parked_polls += 1
            if plan.batch_size > 0 and not plan.done:
                plan = self.client.pull(self.worker_id, self._parts.params)
                self._apply(plan)
            else:
                self._follow(plan)
        except ServerError as exc:
            self._apply(self._recover(exc))
        return self.plan

    def step(self) -> StepHeader:
        """Push this step's gradients; return once the new parameters are in the model."""
        if self._fetch_started is None:
            raise RuntimeError("step() called without a batch: use batches() or next_batch() first")
        PROBE.compute_ends()
        burn_cpu(self.step_overhead_ms)
        synchronize(self.device)
        waited_ms = self._parts.arrivals.take_waited_ms()  # the forward's wait for parameters: exposed, not compute
        if self.slowdown > 1.0:
            wall_s = time.perf_counter() - self._fetch_started - waited_ms / 1000.0
            time.sleep(slowdown_delay(wall_s, time.process_time() - self._fetch_cpu, self.slowdown))
        compute_end = self._compute_end = time.perf_counter()
        compute_ms = max(0.0, (compute_end - self._fetch_started) * 1000.0 - waited_ms)
        cpu_now = time.process_time()
        self._own_time.compute_ended(compute_ms, cpu_now - self._fetch_cpu, cpu_now)
        self.exposed_ms += waited_ms
        self._fetch_started = None
        if self._parts.forward is not None:
            self._parts.forward.check_step(self._streamed)
        if not self._settle_params():  # the last reply failed while it streamed: this step's gradient is dropped
            return self.plan
        # what the step reports (exposed_ms and _push_ms are the last step's)
        times = PushTimes.of_step(compute_ms, self.exposed_ms, self._push_ms, self.spec.balance, self.spec.mode,
                                  self.spec.allreduce, self.data_wait_ms)
        stream = self._parts.buckets.finish() if self._parts.buckets is not None else None
        if stream is not None:  # the buckets are out (or going): close the push; the reply below
            arrivals = self._parts.arrivals if self._parts.forward is not None else None
            return self._finish_step(lambda: stream.end(times, arrivals=arrivals)(), compute_ms,
                                     compute_end, streamed=arrivals is not None)
        if self._parts.on_device is None:
            grads = device_grads = flatten_grads(self.model, self._parts.grads)
        else:  # the collective takes them where they are (NCCL: no trip through the CPU); the wire from the CPU
            device_grads = flatten_grads(self.model, self._parts.on_device[1])
            grads = self._parts.grads if self._parts.collective is not None else self._parts.grads.copy_(device_grads)
        if self._optimizer is not None:
            try:
                values = self._optimizer.update(grads, self.plan.lr)
            except StepRefused as exc:
                log.warning("%s: %s; the batch is dropped", self.name, exc)
                plan = self.client.pull(self.worker_id, self._parts.params)
                self._apply(plan)
                return plan
        else:
            values = grads
        if self._parts.collective is not None:
            return self._finish_step(lambda: self._collective_push(device_grads, times), compute_ms)
        return self._finish_step(lambda: self._push(values, times), compute_ms)

    def _push(self, values: torch.Tensor, times: PushTimes) -> StepHeader:
        """The PS path's push of a whole gradient (ASP: update); the reply's parameters land in self._parts.params."""
        push = partial(self.client.push, self._meta(times), values, self._parts.params)
        return after_cancelled_stream(push) if self._parts.buckets is not None else push()

    def _finish_step(self, push: Callable[[], StepHeader | None], compute_ms: float, pushed: float | None = None,
                     streamed: bool = False) -> StepHeader:
        """Run `push` (from `pushed`, default now: where this worker's own part of it begins), or
        recover from its failure; the new parameters into the model, the plan followed. A push that
        returns None took no step (the plan it settled stands, the model holds its parameters).
        `streamed`: the push returns at its reply's header, the parameters streaming in after it."""
        pushed = time.perf_counter() if pushed is None else pushed
        self._streamed = False
        try:
            plan = push()
            if plan is None:
                return self.plan
        except ServerError as exc:
            plan = self._recover(exc)
        else:
            self.steps += 1
            self.last_compute_ms = compute_ms
            self._trained.write(self._drawn_step, self.worker_id)
            self._streamed = streamed
            self.streamed_replies += streamed
        if self._streamed:  # the model's parameters are views of self._parts.params: they fill in as chunks land
            self._follow(plan)
            if plan.done:
                self.wait_params()
        else:
            self._apply(plan)
        if self._parts.collective is None:  # the fast path's is taken at the next fetch (worker/timing/own_time.py)
            self._push_ms = push_own_ms(self.client.last_push, pushed, time.perf_counter())
        return self.plan

    def wait_params(self) -> StepHeader:
        """Return once the last reply's parameters are all in the model (step() returns at its first
        chunk: worker/paths/forward_order.py); the plan."""
        self._settle_params()
        return self.plan

    def _settle_params(self) -> bool:
        """Wait for a reply still streaming parameters in; False if it failed: the gradient computed
        meanwhile is dropped, and the worker recovered (resync or rejoin, as after a failed push)."""
        try:
            self._parts.arrivals.wait_all()
        except ServerError as exc:
            if self._parts.buckets is not None:
                self._parts.buckets.disarm()
            self._fetch_started = None
            self._apply(self._recover(exc))
            return False
        return True

    def _collective_push(self, grads: torch.Tensor, times: PushTimes) -> StepHeader | None:
        """--allreduce: settle the previous report, then all-reduce and step with the group; None if
        the job ended with the previous step (this batch was one too many: the settled plan stands)."""
        plan = self._settle_report()
        if plan.done:
            return None
        if self._parts.collective is None:  # the reply switched the job to the PS path (ps/rounds/path_trial.py)
            return self._push(grads.cpu(), times)
        return self._collective_step(grads, times, plan)

    def _settle_report(self) -> StepHeader:
        """--allreduce: the plan for this step, from the reply to the previous step's report (rank 0
        first sends the snapshot it asks for); the current plan when no report is outstanding."""
        report, self._report = self._report, None
        if report is None:
            return self.plan
        plan = self._send_snapshot(report())
        self._follow(plan)  # the model already holds the parameters: the group's step was local
        return plan

    def _collective_step(self, grads: torch.Tensor, times: PushTimes, plan: StepHeader) -> StepHeader:
        """--allreduce: all-reduce and step with the group, then report the step (no values) to the
        server. A failed group (a peer left or crashed) is re-formed from the server's next generation
        and the step retried; rank 0 sends the parameters when the server asks for them.

        The report's reply is read at the next step, before its all-reduce (`_settle_report`), not
        here: the new parameters are already in hand, so the worker computes its next batch while the
        server waits for the other reports and closes the round. A batch size the reply names applies
        to the batch after that one (a group it names, to the next all-reduce, as before); the
        returned plan is the current one moved on a round."""
        assert self._parts.collective is not None
        batch = self._drawn
        while True:
            try:
                mean = self._parts.collective.reduce(grads, batch, plan, partial(generation_stands, self.client, self.worker_id,
                                                                           self._parts.params))
                break
            except CollectiveError as exc:
                log.warning("%s: %s; waiting for the server's next group", self.name, str(exc).splitlines()[0][:300])
                plan = await_regroup(self.client, self.worker_id, self._parts.params, plan, self.retry_for)
                if plan.done:
                    return self._send_snapshot(plan)
        # the report goes out before the optimizer step: the round closes on the server meanwhile
        local_sq_norm, global_sq_norm = self._parts.collective.sq_norms
        report = PushMeta(self.worker_id, plan.round, plan.version, batch, PushTimes(times.compute_ms), "float32",
                          kind="report", generation=plan.group.generation, local_sq_norm=local_sq_norm,
                          global_sq_norm=global_sq_norm)
        self._report = self.client.start_push(report, torch.empty(0), self._parts.params)
        if mean is not None:
            self._parts.collective.apply(mean, plan)
        return replace(plan, round=plan.round + 1, snapshot_requested=False)

    def _send_snapshot(self, plan: StepHeader) -> StepHeader:
        """The member asked (the group's hub): push the parameters and the optimizer state (the server's
        copy of the global model, and what a checkpoint resumes from)."""
        if not plan.snapshot_requested:
            return plan
        assert self._parts.collective is not None
        snapshot = PushMeta(self.worker_id, plan.round, plan.version, 0, PushTimes(), "float32", kind="snapshot")
        try:
            return self.client.push(snapshot, self._parts.collective.snapshot(), self._parts.params)
        except ServerError:
            return plan  # no longer the hub, or the request was served: the server asks again if needed

    def _recover(self, error: ServerError) -> StepHeader:
        """After a failed push: resync (stale round/version), or rejoin with backoff (server
        restarted, this worker evicted, connection lost). The step's gradient is dropped. A resync
        whose pull fails (the server restarted meanwhile) goes on to rejoin, from the pull's error."""
        if error.code == "FAILED_PRECONDITION" and "rejoin" not in error.message:
            try:  # allreduce: the local parameters are the group's; keep them
                return self.client.pull(self.worker_id, self._parts.params, header_only=self.spec.allreduce)
            except ServerError as exc:
                error = exc
        if error.code not in ("UNAVAILABLE", "NOT_FOUND", "FAILED_PRECONDITION"):
            raise error
        return rejoin_with_backoff(self.name, self.client, self.retry_for, error, self._rejoin, lambda: self.worker_id,
                                   self.plan)

    def _rejoin(self, deadline: float) -> StepHeader:
        """Leave (if the server still knows this worker) and join again, by `deadline` (time.monotonic)."""
        with contextlib.suppress(ServerError):
            self.client.leave(self.worker_id, timeout=max(0.01, min(deadline - time.monotonic(), LEAVE_TIMEOUT_S)))
        joined = self.client.join(self.name, self.cores, timeout=max(0.01, deadline - time.monotonic()),
                                  cuda_device=gpu_uuid(self.device), max_batch=self.max_batch)
        if replace(joined.spec, allreduce=self.spec.allreduce) != self.spec or joined.layout != Layout.of(self.model):
            raise ServerError("FAILED_PRECONDITION", "the server now runs a different job; not rejoining")
        if joined.spec.allreduce != self.spec.allreduce:  # --allreduce auto's trial switched the path meanwhile
            self.spec = joined.spec
            self._parts = self._path_parts(self._parts.params, self._parts)
        if self._parts.collective is not None:  # a newcomer again: the next group syncs it from a peer
            self._parts.collective.rejoined()
        self.worker_id = joined.worker_id
        self._heartbeat.retarget(joined.worker_id, joined.heartbeat_interval_s)  # the new server's --evict-after
        self.rejoins += 1
        if self._optimizer is not None:
            self._optimizer.reset()
        return self._pull_global_model()

    # --------------------------------------------------------------- lifecycle
    def leave(self) -> None:
        """Tell the server this worker is going (not needed once the job is done)."""
        if not self.done:
            self.client.leave(self.worker_id)

    def close(self) -> None:
        """Stop the heartbeat, leave the process group and close the connection (`closed` then says
        whether the connection's close finished: see PSClient.close)."""
        self._heartbeat.stop()
        self._counted.close()
        self._batches.close()
        self._parts.close()
        self.closed = self.client.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        """Leave unless the job is done (an error, or a loop that stopped early), then close."""
        try:
            with contextlib.suppress(ServerError):
                self.leave()
        finally:
            self.close()

"""A step's clocks and the times its push reports (common.transport.messages.PushTimes).

Compute runs from the batch's fetch to step()'s call, less the forward's wait for parameters still
streaming in (worker/paths/forward_order.py); it is what the batch policy balances. Exposed
communication runs from a compute's end to the next fetch, plus that wait. The worker's own part of
its communication is its push's on the PS path, and the CPU it spends between compute and fetch on
the fast path (own_time.py); under --balance busy it is reported with the next step's compute."""

from __future__ import annotations

import time

from common.job.spec import JobSpec
from common.transport.messages import PushTimes
from worker.probes.cpu_parts import PROBE, Probe
from worker.probes.resources import ComputeEnd
from worker.timing.own_time import OwnTime, push_own_ms
from worker.transport.bucket_stream import PushTiming


class StepTimer:
    """The clocks of one step after another. `end_compute` ends a step's compute (its device's work
    waited for; a slower machine emulated around it: worker.probes.resources.SlowerMachine) and
    says how much of it was waiting; `probe` hears where the main thread's parts begin and end."""

    def __init__(self, end_compute: ComputeEnd, probe: Probe = PROBE) -> None:
        self._end_compute = end_compute
        self._probe = probe
        self._fetched: tuple[float, float] | None = None  # this step's fetch: (perf_counter, process_time) s
        self.compute_end: float | None = None  # when the last step's compute ended (perf_counter s)
        self.compute_ms = 0.0  # the last step's compute
        self.exposed_ms = 0.0  # the last step's exposed communication
        self.data_wait_ms = 0.0  # of this step's compute, the wait for its batch
        self.push_ms = 0.0  # the last push's own part
        self._own_time = OwnTime()  # the fast path's own part, from CPU time

    @property
    def computing(self) -> bool:
        """Whether a batch was fetched and its step not yet taken."""
        return self._fetched is not None

    def fetch_begins(self, steps_done: int, own_from_cpu: bool) -> None:
        """A batch is fetched: this step's compute starts, the last one's exposed time ends.
        `own_from_cpu`: the last step's own part is the CPU spent since its compute (the fast path on a CPU)."""
        self._probe.round_begins(steps_done)
        now, cpu_now = time.perf_counter(), time.process_time()
        self._fetched = (now, cpu_now)
        if own_from_cpu:
            self.push_ms = self._own_time.own_ms(cpu_now)
        if self.compute_end is not None:
            self.exposed_ms = (now - self.compute_end) * 1000.0
            self.compute_end = None

    def batch_drawn(self, data_wait_ms: float) -> None:
        """The batch is in, after `data_wait_ms` waiting for the loader."""
        self._probe.batch_drawn()
        self.data_wait_ms = data_wait_ms

    def compute_ends(self) -> None:
        """step() is called: the compute ends (`compute_ms`, `compute_end`); the forward's wait for
        parameters counts as exposed, not as compute."""
        assert self._fetched is not None, "compute_ends() without fetch_begins()"
        self._probe.compute_ends()
        started, started_cpu = self._fetched
        waited_ms = self._end_compute(started, started_cpu)
        end = self.compute_end = time.perf_counter()
        self.compute_ms = max(0.0, (end - started) * 1000.0 - waited_ms)
        cpu_now = time.process_time()
        self._own_time.compute_ended(self.compute_ms, cpu_now - started_cpu, cpu_now)
        self.exposed_ms += waited_ms
        self._fetched = None

    def times(self, spec: JobSpec) -> PushTimes:
        """What this step's push reports (the exposed time and own part are the last step's)."""
        return PushTimes.of_step(self.compute_ms, self.exposed_ms, self.push_ms, spec.balance, spec.mode,
                                 spec.allreduce, self.data_wait_ms)

    def push_ended(self, timing: PushTiming, pushed: float) -> None:
        """The PS path: the push that began at `pushed` (perf_counter s) is answered and its
        parameters are in the model; its own part (worker/timing/own_time.py's push_own_ms)."""
        self.push_ms = push_own_ms(timing, pushed, time.perf_counter())

    def drop(self) -> None:
        """The step in progress is dropped (a reply that failed while it computed): no compute to end."""
        self._fetched = None

    def parked(self) -> None:
        """The worker waits, parked: the wait is no communication a step left exposed, so the next
        step's exposed time is its forward's wait alone (not added to the step's before the wait)."""
        self.compute_end = None
        self.exposed_ms = 0.0

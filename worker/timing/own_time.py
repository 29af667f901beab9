"""A worker's own part of its step's communication, for --balance busy: the work it does itself
between the end of one step's compute and the next batch's fetch, apart from the wait for the round.

On the PS path it is timed by the wall clock (`push_own_ms`: sending its chunks, and the reply from
its first chunk into the model; waiting for the round lies between). On the fast path the wall clock
cannot tell them apart (`OwnTime`): the all-reduce's own sends, receives and sums are inside the same
call as the wait for the slowest peer. CPU time can: the process's CPU time over that span (the
bucket's scaling, gloo's and gRPC's threads, the optimizer step, the report) is the worker's own
work, and waiting costs none. It is turned into wall time at the speed the step's compute ran at
(wall ms per CPU ms of the compute), which on a CPU-quota'd worker is what the quota makes of it.
"""

from __future__ import annotations

from worker.transport.bucket_stream import PushTiming

MAX_WALL_PER_CPU = 1000.0
"""A bound on the compute's wall ms per CPU ms: a compute that used next to no CPU (a GPU worker waiting on
its device) says nothing of how fast this worker's CPU work runs."""


class OwnTime:
    """Tracks the compute's speed and the CPU spent after it; `own_ms` is the last span's own part."""

    def __init__(self) -> None:
        self.wall_per_cpu = 1.0
        self._after_compute: float | None = None  # the process's CPU seconds when the last compute ended

    def compute_ended(self, compute_ms: float, compute_cpu_s: float, cpu_now_s: float) -> None:
        """A step's compute took `compute_ms` of wall time and `compute_cpu_s` of the process's CPU."""
        if compute_cpu_s > 0 and compute_ms > 0:
            self.wall_per_cpu = min(MAX_WALL_PER_CPU, compute_ms / (compute_cpu_s * 1000.0))
        self._after_compute = cpu_now_s

    def own_ms(self, cpu_now_s: float) -> float:
        """The next batch is fetched (the process's CPU seconds now): the CPU spent since the last
        compute ended, in wall ms at the compute's speed; 0 when no compute ended since the last call."""
        started, self._after_compute = self._after_compute, None
        if started is None:
            return 0.0
        return max(0.0, cpu_now_s - started) * 1000.0 * self.wall_per_cpu


def push_own_ms(timing: PushTiming, pushed: float, now: float) -> float:
    """The PS path: the own part of the push that began at `pushed` and whose reply is in the model at
    `now` (perf_counter seconds): sending its chunks, and from the reply's first chunk to the end;
    0 when the push recorded no timing (--shards)."""
    if not pushed < timing.uploaded <= timing.replied:
        return 0.0
    return ((timing.uploaded - pushed) + (now - timing.replied)) * 1000.0

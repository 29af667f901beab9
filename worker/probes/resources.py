"""What a worker's machine is: the cores it declares by default, and the extra cost that makes it
behave like a slower one: `ps-worker --slowdown` (a sleep scaled from the step's own compute) and
`--step-overhead-ms` (a fixed CPU cost per step), put around the end of a step's compute once
(`SlowerMachine.around`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from common.ops.cpu_quota import usable_cpus

DEFAULT_THREADS = 1
"""torch threads a worker computes with unless told otherwise (`ps-worker --threads`, `connect(threads=)`): one,
as workers share cores with each other and the server (torch's thread per core makes them many times slower)."""
MAX_STEP_OVERHEAD_MS = 60_000.0
"""The most `--step-overhead-ms` (a profile's `step_overhead_ms`) emulates: a minute of CPU a step, far
beyond any optimizer's or launch's fixed cost; more only stalls the job (1e308 burned CPU forever)."""

ComputeEnd = Callable[[float, float], float]
"""Ends the compute of a step that began at (time.perf_counter, time.process_time) seconds: its
device's work waited for; the ms of it spent waiting rather than computing (the forward's wait for
parameters)."""


def default_cores() -> float:
    """CPUs this process may run on: its affinity, no more than its cgroups' CPU quota (a container's
    `--cpus`, a Kubernetes limit)."""
    return usable_cpus()


def slowdown_delay(wall_s: float, cpu_s: float, slowdown: float) -> float:
    """The extra sleep that makes a step's compute `slowdown` times longer, as on a slower machine.

    It scales the time the process actually computed: the wall time, but no more than the CPU
    time it used, so time spent stopped (SIGSTOP) or waiting for a CPU is not multiplied.
    """
    return max(0.0, min(wall_s, cpu_s)) * (slowdown - 1.0)


def burn_cpu(ms: float) -> None:
    """Spend `ms` of this process's CPU time on busy work (not sleep): `--step-overhead-ms`, a fixed
    per-step cost that a CPU quota or a slowdown stretches like the real work of a step."""
    if ms <= 0:
        return
    end = time.process_time() + ms / 1000.0
    spin = 0
    while time.process_time() < end:
        for _ in range(200):
            spin += 1


@dataclass(frozen=True)
class SlowerMachine:
    """A machine `slowdown` times slower than this one, with `overhead_ms` of CPU work more per step."""

    slowdown: float = 1.0
    overhead_ms: float = 0.0

    def __post_init__(self) -> None:
        if not self.slowdown >= 1.0:
            raise ValueError(f"slowdown must be >= 1, got {self.slowdown}")
        if not 0.0 <= self.overhead_ms <= MAX_STEP_OVERHEAD_MS:
            raise ValueError(f"step_overhead_ms must be a number of ms in [0, {MAX_STEP_OVERHEAD_MS:g}], "
                             f"got {self.overhead_ms}")

    def around(self, end: ComputeEnd) -> ComputeEnd:
        """`end` on this machine: the overhead burned first (a slowdown stretches it too), then `end`,
        then the sleep that stretches the compute; `end` itself where the machine is this one."""
        if self.slowdown == 1.0 and self.overhead_ms == 0.0:
            return end
        slowdown, overhead_ms = self.slowdown, self.overhead_ms

        def slower(started_s: float, started_cpu_s: float) -> float:
            burn_cpu(overhead_ms)
            waited_ms = end(started_s, started_cpu_s)
            if slowdown > 1.0:
                wall_s = time.perf_counter() - started_s - waited_ms / 1000.0
                time.sleep(slowdown_delay(wall_s, time.process_time() - started_cpu_s, slowdown))
            return waited_ms

        return slower

"""What a worker's machine is: the cores it declares by default, and the extra cost that makes it
behave like a slower one: `ps-worker --slowdown` (a sleep scaled from the step's own compute) and
`--step-overhead-ms` (a fixed CPU cost per step)."""

from __future__ import annotations

import os
import time


def default_cores() -> float:
    """CPUs this process may run on."""
    try:
        return float(len(os.sched_getaffinity(0)))
    except AttributeError:
        return float(os.cpu_count() or 1)


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

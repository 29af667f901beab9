"""The memory this process may still take: what a job's model and data set are checked against before
they are built (common.job.memory_bounds), and what a CPU worker's memory probe plans a batch in."""

from __future__ import annotations

import math
from pathlib import Path


def available_cpu_bytes(meminfo: Path = Path("/proc/meminfo"), cgroup: Path = Path("/sys/fs/cgroup")) -> float:
    """MemAvailable, or the cgroup v2 limit less its usage if lower; infinity where neither can be read."""
    available = math.inf
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            available = min(available, float(limit) - float((cgroup / "memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return available

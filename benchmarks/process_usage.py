"""A process's CPU time and memory from Linux's /proc, for the scale benchmark: the server's and its
shard processes' CPU over a measured window, per round and per push, and the processes' peak RSS
(VmHWM) and proportional set size (Pss)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from deploy.proc_stat import read_proc_stat


def proc_kb_field(path: Path, name: str) -> float | None:
    """A ``Name:   123 kB`` line of a /proc file (status, smaps_rollup) in MB; None where it cannot be read."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith(f"{name}:"):
                return round(int(line.split()[1]) / 1024, 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


def peak_rss_mb(pid: int) -> float | None:
    """VmHWM (peak resident set) of a live process, from /proc."""
    return proc_kb_field(Path(f"/proc/{pid}/status"), "VmHWM")


def pss_mb(pid: int) -> float | None:
    """Pss (proportional set size) of a live process, from /proc/PID/smaps_rollup."""
    return proc_kb_field(Path(f"/proc/{pid}/smaps_rollup"), "Pss")


def cpu_seconds(pids: Sequence[int]) -> dict[int, float]:
    """User + system CPU seconds of each live process in `pids` (those /proc cannot read are left out)."""
    found = {}
    for pid in pids:
        stat = read_proc_stat(pid)
        if stat is not None:
            found[pid] = stat.cpu_s
    return found


def cpu_fields(mode: str, workers: int, steps: int, server_pid: int, shard_pids: Sequence[int],
               before: dict[int, float], after: dict[int, float]) -> dict[str, Any]:
    """The report's CPU fields from the server's and its shards' CPU seconds at the window's two ends
    (None where a process was not read at both); `steps`: the window's rounds (BSP) or updates (ASP)."""
    def used(pid: int) -> float | None:
        return after[pid] - before[pid] if pid in before and pid in after else None

    shards = [used(pid) for pid in shard_pids]
    server = used(server_pid)
    total = None if server is None or None in shards else server + sum(s for s in shards if s is not None)
    pushes = steps * workers if mode == "bsp" else steps

    def per(count: int) -> float | None:
        return round(1e3 * total / count, 3) if total is not None and count > 0 else None

    return {
        "server_cpu_s": None if total is None else round(total, 2),
        "shard_cpu_s": [None if s is None else round(s, 2) for s in shards],
        "server_cpu_ms_per_round": per(steps) if mode == "bsp" else None,
        "server_cpu_ms_per_push": per(pushes),
    }


def mean_max(values: Sequence[float | None]) -> dict[str, float | None]:
    """Mean and max of the values read (None where none was)."""
    known = [v for v in values if v is not None]
    if not known:
        return {"mean": None, "max": None}
    return {"mean": round(sum(known) / len(known), 1), "max": max(known)}

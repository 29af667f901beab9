"""CPU time over a timed window, for the transport benchmark's rows: how much of the machine's
cores a measurement kept busy, beside how long it took (on a 2-core machine the two sides of a
round trip can use all of it, and then no faster code path is left to overlap)."""

from __future__ import annotations

import time
from typing import Any

from deploy.proc_stat import read_proc_stat


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds that process `pid` (all its threads) has used; None where /proc
    cannot tell (the process is gone, or no /proc)."""
    stat = read_proc_stat(pid)
    return None if stat is None else stat.cpu_s


class CpuWindow:
    """This process's CPU time and another one's (a server, by pid: 0 for none) from `start` to
    `stop`. /proc counts the other process in clock ticks (10 ms), so a short window reads coarse."""

    def __init__(self, other_pid: int = 0) -> None:
        self._other = other_pid
        self._own0 = 0.0
        self._other0: float | None = None
        self.own_s = 0.0
        self.other_s: float | None = None

    def start(self) -> None:
        self._own0 = time.process_time()
        self._other0 = process_cpu_s(self._other) if self._other else None

    def stop(self) -> None:
        self.own_s = time.process_time() - self._own0
        other = process_cpu_s(self._other) if self._other else None
        self.other_s = other - self._other0 if other is not None and self._other0 is not None else None


def cpu_fields(server_s: float | None, client_s: list[float], steps: list[int], window_s: float) -> dict[str, Any]:
    """A row's CPU fields: the server's and each client's (mean) CPU ms per step, and the cores the
    whole measurement kept busy ((server + every client) CPU / wall window; None without the server's)."""
    per_client = [1e3 * c / n for c, n in zip(client_s, steps, strict=True) if n]
    client = round(sum(per_client) / len(per_client), 2) if per_client else None
    server = round(1e3 * server_s / steps[0], 2) if server_s is not None and steps and steps[0] else None
    busy = round((server_s + sum(client_s)) / window_s, 2) if server_s is not None and window_s > 0 else None
    return {"cpu_ms_per_step": {"server": server, "client": client}, "cores_busy": busy}

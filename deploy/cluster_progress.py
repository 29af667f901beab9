"""What a local cluster (deploy/launcher.py's :class:`LocalCluster`) reports while it runs: its
processes, the server's address, the workers' and the server's shares, the metrics log, and the job's
progress (the server's exit, a worker that failed, the wait for the end). It starts and stops nothing.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from common.job.endings import ended_early
from deploy.cluster_processes import ClusterProcesses
from deploy.cluster_quotas import CpuQuotas
from ps.ops.metrics import read_metrics


class ClusterProgress:
    """The views of a cluster's quotas (`cpu`), processes (`procs`) and logs (`workdir`), and the
    server's port once it listens (`_port`)."""

    cpu: CpuQuotas
    procs: ClusterProcesses
    workdir: Path
    _port: int | None

    # ------------------------------------------------------------ properties
    @property
    def server(self) -> subprocess.Popen[bytes] | None:
        """The server process (the latest, after a restart); None before start()."""
        return self.procs.server

    @property
    def processes(self) -> dict[str, subprocess.Popen[bytes]]:
        """The worker processes by name."""
        return self.procs.processes

    @property
    def limiting(self) -> str:
        """How workers are confined: ``cgroup-v1``, ``cgroup-v2`` or ``slowdown`` (probes before start())."""
        return self.cpu.limiting

    @property
    def shares(self) -> list[float]:
        """Each worker's share of cores now."""
        return self.cpu.shares

    @property
    def server_share(self) -> float | None:
        """The server's share of cores (None: unlimited)."""
        return self.cpu.server_share

    @property
    def target(self) -> str:
        """The server's address, ``127.0.0.1:PORT``."""
        if self._port is None:
            raise RuntimeError("the server is not listening yet (call start())")
        return f"127.0.0.1:{self._port}"

    @property
    def metrics_path(self) -> Path:
        """The server's JSON-lines metrics log."""
        return self.workdir / "metrics.jsonl"

    # ------------------------------------------------------------- progress
    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        """The metrics log parsed so far (only events of ``kind`` if given)."""
        if not self.metrics_path.exists():
            return []
        return [e for e in read_metrics(self.metrics_path) if kind is None or e.get("event") == kind]

    def poll(self) -> int | None:
        """The server's exit code, or None while it runs."""
        if self.server is None:
            raise RuntimeError("the cluster has not started")
        return self.server.poll()

    def check_workers(self) -> None:
        """Raise :class:`WorkerFailedError` if a worker died while the server still runs.

        Also raises the error that kept the startup quota from dropping to the shares (fast_start).
        """
        if self.cpu.settle_error is not None:
            raise RuntimeError(f"could not apply the workers' quotas when the job started: {self.cpu.settle_error}")
        self.procs.check_workers(self.job_ended_early)

    def job_ended_early(self) -> bool:
        """Whether the server ended the job early, by the last `end` record of its metrics log (written
        before any worker hears of the end): a worker's exit status 3 then says the same, not a crash."""
        ends = self.events("end")
        return bool(ends) and ended_early(ends[-1]["reason"])

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the server to exit and return its status; TimeoutError after ``timeout`` seconds.

        Raises :class:`WorkerFailedError` as soon as a worker exits non-zero while the server runs
        (the server would wait for it, or evict it and go on with a cluster that no longer matches
        the profile), but for a worker's 3 after the job ended early. Workers get ``STOP_GRACE_S`` to
        exit after the server.
        """
        return self.procs.wait(timeout, self.check_workers)

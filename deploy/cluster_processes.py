"""A local cluster's processes: each started with its log in the cluster's folder, inside its CPU group,
recorded where the cluster's stop finds it, watched for a worker that dies while the job runs, and
stopped together."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from common.job.endings import ENDED_EARLY
from deploy.cgroups import CpuLimiter
from deploy.cluster_exits import WorkerFailedError, stop_all, wait_all, wait_for_port
from deploy.run_files import last_line
from deploy.signals import HELD_SIGNALS, parent_death_signal, signals_deferred


class ClusterProcesses:
    """The server process (``server``, restarts included) and the worker processes by name (``processes``)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.server: subprocess.Popen[bytes] | None = None
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.server_starts = 0
        self._logs: list[IO[bytes]] = []

    def spawn(self, log_name: str, argv: list[str], limiter: CpuLimiter | None,
              record: Callable[[subprocess.Popen[bytes]], None]) -> None:
        """Start a process and `record` it where `stop` looks (self.server, self.processes).

        SIGINT/SIGTERM/SIGHUP are held from before the fork until the process is recorded: raised
        in between (inside Popen, or before the assignment), they left a running child that `stop`
        did not know of, and it outlived the cluster. The child unblocks them before exec.
        """
        arm = parent_death_signal()

        def preexec() -> None:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD_SIGNALS)
            arm()
            if limiter is not None:
                limiter.preexec()

        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        log = open(self.workdir / f"{log_name}.log", "wb")  # noqa: SIM115 (closed by stop())
        self._logs.append(log)
        with signals_deferred():
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                preexec_fn=preexec, start_new_session=True,  # noqa: PLW1509 (raw syscalls only; see CpuLimiter.preexec)
            )
            record(proc)

    def start_server(self, argv: list[str], limiter: CpuLimiter | None, port_file: Path) -> int:
        """Spawn the server and wait until it listens; its port. A restart logs to ``server-N.log``."""
        port_file.unlink(missing_ok=True)
        self.server_starts += 1
        log_name = "server" if self.server_starts == 1 else f"server-{self.server_starts}"  # a restart keeps the log before
        self.spawn(log_name, argv, limiter, functools.partial(setattr, self, "server"))
        assert self.server is not None
        return wait_for_port(self.server, port_file, self.workdir / "server.log")

    def start_worker(self, name: str, argv: list[str], limiter: CpuLimiter | None) -> None:
        """Spawn worker ``name`` (again, after it died, or for the first time)."""
        self.spawn(name, argv, limiter, functools.partial(self.processes.__setitem__, name))

    def failed_workers(self, job_ended_early: Callable[[], bool] | None = None) -> list[tuple[str, int]]:
        """Workers that have exited with a non-zero status, as ``(name, status)``. A worker's ENDED_EARLY
        is no failure where ``job_ended_early()`` says the server ended the job early: the worker heard
        the end and exited with the status the server exits with once its --grace is over."""
        exited = [(n, p.returncode) for n, p in self.processes.items() if p.poll() not in (None, 0)]
        if job_ended_early is not None and any(code == ENDED_EARLY for _, code in exited) and job_ended_early():
            return [(n, code) for n, code in exited if code != ENDED_EARLY]
        return exited

    def check_workers(self, job_ended_early: Callable[[], bool] | None = None) -> None:
        """Raise :class:`WorkerFailedError` if a worker died while the server still runs (not one that
        exited after the job ended early: see :meth:`failed_workers`)."""
        if self.server is None or self.server.poll() is not None:
            return
        failed = self.failed_workers(job_ended_early)
        if failed:
            raise WorkerFailedError(failed, {n: last_line(self.workdir / f"{n}.log") for n, _ in failed})

    def wait(self, timeout: float | None, check: Callable[[], None]) -> int:
        """Wait for the server's exit status, calling ``check`` meanwhile; TimeoutError after ``timeout`` s."""
        if self.server is None:
            raise RuntimeError("the cluster has not started")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            check()
            code = self.server.poll()
            if code is not None:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"the server did not finish within {timeout:g} s")
            time.sleep(0.1)
        wait_all(list(self.processes.values()))
        return code

    def stop(self) -> None:
        """SIGTERM, then SIGKILL, whatever still runs, and close the logs."""
        stop_all([p for p in [*self.processes.values(), self.server] if p is not None])
        for log in self._logs:
            with contextlib.suppress(OSError):
                log.close()

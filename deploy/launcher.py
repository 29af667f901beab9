"""Start a parameter server and one process per worker on loopback, each worker confined to a CPU share.

:class:`LocalCluster` is the local emulator's engine (``ps-cluster run``) and the benchmarks'
launcher. Each worker runs in its own cgroup (:class:`deploy.cgroups.CpuLimiter`) with a quota of
``share`` cores; the process enters the group in ``preexec`` (after fork, before exec), so neither it
nor any thread it starts ever runs unthrottled. Quotas are created with ``reserve=True``: the quota
is a floor as well as a cap. Where no cgroup CPU controller is writable, the workers run unlimited
with ``--slowdown max_share/share`` instead, which keeps the ratios but cannot change while they run.

Every process and every group is removed by :meth:`LocalCluster.close`, which ``__exit__`` calls and
which is idempotent; children also get ``SIGKILL`` if the process that started them dies, and a
later run's :func:`deploy.cgroups.cleanup_stale` removes the groups a killed launcher left behind.
Use :func:`deploy.signals.signals_as_exceptions` in a program's main thread so that SIGTERM unwinds
through ``close()`` like Ctrl-C does.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from deploy.cluster_exits import START_TIMEOUT_S, STOP_GRACE_S, ServerStartError, WorkerFailedError
from deploy.cluster_processes import ClusterProcesses
from deploy.cluster_progress import ClusterProgress
from deploy.cluster_quotas import LIMITERS, CpuQuotas
from deploy.signals import signals_deferred

__all__ = [
    "LIMITERS", "START_TIMEOUT_S", "STOP_GRACE_S", "LocalCluster", "ServerStartError", "WorkerFailedError", "WorkerSpec",
]


@dataclass(frozen=True)
class WorkerSpec:
    """One emulated worker: its name, CPU share (cores of CPU time), torch threads and extra CLI flags."""

    name: str
    share: float
    threads: int = 1
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"worker name must be a non-empty string, got {self.name!r}")
        if isinstance(self.share, bool) or not isinstance(self.share, (int, float)) or not math.isfinite(self.share) or self.share <= 0:
            raise ValueError(f"worker {self.name!r}: share must be a number of cores > 0, got {self.share!r}")
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1:
            raise ValueError(f"worker {self.name!r}: threads must be an integer >= 1, got {self.threads!r}")


def check_names(workers: Sequence[WorkerSpec]) -> None:
    """ValueError unless there are workers and their names are unique."""
    if not workers:
        raise ValueError("a cluster needs at least one worker")
    names = [w.name for w in workers]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"worker names must be unique, repeated: {', '.join(duplicates)}")


def worker_argv(spec: WorkerSpec, target: str, slowdown: float | None, *, quiet: bool) -> list[str]:
    """The ``ps-worker`` command line of `spec` (``--slowdown`` under the slowdown fallback, when not 1)."""
    argv = [
        sys.executable, "-m", "worker.cli", "--server", target, "--name", spec.name,
        "--cores", repr(float(spec.share)), "--threads", str(spec.threads),
        "--device", "cpu",  # the emulated differences are CPU quotas; extra_args may name a GPU
    ]
    if slowdown is not None and slowdown != 1.0:
        argv += ["--slowdown", repr(slowdown)]
    if quiet:
        argv.append("--quiet")
    return argv + list(spec.extra_args)


class LocalCluster(ClusterProgress):
    """A ``ps-server`` process and one ``ps-worker`` process per :class:`WorkerSpec`, on 127.0.0.1.

    Use as a context manager; ``start()`` launches, ``wait()`` waits for the job, ``close()`` (also on
    ``__exit__``) kills whatever still runs and removes every cgroup. Logs go to ``workdir``:
    ``server.log``, ``<worker>.log``, and the metrics log ``metrics.jsonl``. The quotas are ``self.cpu``
    (:class:`deploy.cluster_quotas.CpuQuotas`: also ``held()``, ``settled``), the processes ``self.procs``
    (:class:`deploy.cluster_processes.ClusterProcesses`: also ``failed_workers()``, ``server_starts``).
    What it reports (its processes, address, shares, metrics and the job's progress) is
    :class:`deploy.cluster_progress.ClusterProgress`'s.
    """

    def __init__(
        self,
        server_args: Sequence[str],
        workers: Sequence[WorkerSpec],
        workdir: Path,
        *,
        period_us: int | None = None,
        limiter: str = "auto",
        server_share: float | None = None,
        run_id: str = "cluster",
        quiet: bool = True,
        fast_start: bool = True,
    ) -> None:
        """See the class docstring; ``fast_start`` lets workers start up at a full core or more.

        With ``fast_start`` (cgroups only) each worker's group starts with the quota of the largest
        share (at least one core) while the processes import torch and join, and drops to the
        worker's own share the moment the job starts (the server's first ``adjust`` event, watched
        by a background thread), before the first batch. Without it a 1/8-core worker takes about
        eight times as long to start.
        """
        check_names(workers)
        self.cpu = CpuQuotas([w.share for w in workers], period_us, limiter, server_share, run_id)
        self.server_args = list(server_args)
        self.workers = list(workers)
        self.workdir = Path(workdir)
        self.quiet = quiet
        self.fast_start = fast_start
        self.procs = ClusterProcesses(self.workdir)
        self._port: int | None = None
        self._started = False
        self._closed = False
        self._lock = self.cpu.lock  # one lock: a close() and the fast-start settle never interleave

    # ---------------------------------------------------------------- setup
    def start(self) -> None:
        """Start the server, wait until it listens, then start every worker in its group."""
        if self._started:
            raise RuntimeError("this cluster was started already")
        self._started = True
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        self.cpu.clean_stale()
        self.metrics_path.unlink(missing_ok=True)
        self.cpu.add_server()
        self._port = self._start_server()
        boost = self.fast_start and self.cpu.backend is not None
        startup = max(1.0, *self.shares)
        for spec in self.workers:
            self.cpu.add(spec.name, startup if boost else spec.share)
            self._spawn_worker(spec)
        if boost:
            self.cpu.settle_in_background([w.name for w in self.workers], self.metrics_path,
                                          lambda: self.server is not None and self.server.poll() is not None,
                                          lambda: self._closed)
        else:
            self.cpu.settled.set()

    def _start_server(self, *extra_args: str) -> int:
        """Spawn the server (its flags, then `extra_args`) and wait until it listens; its port."""
        port_file = self.workdir / "port"
        argv = [
            sys.executable, "-m", "ps.server", "--port", "0", "--port-file", str(port_file),
            "--metrics-log", str(self.metrics_path), *self.server_args, *extra_args,
        ]
        return self.procs.start_server(argv, self.cpu.server_limiter, port_file)

    def _spawn_worker(self, spec: WorkerSpec) -> None:
        """Start `spec`'s worker process (in its group, when there is one)."""
        slowdown = self.cpu.slowdowns[self.workers.index(spec)] if self.cpu.backend is None else None
        argv = worker_argv(spec, self.target, slowdown, quiet=self.quiet)
        self.procs.start_worker(spec.name, argv, self.cpu.limiters.get(spec.name))

    # ------------------------------------------------------- supervision
    def respawn_worker(self, name: str) -> None:
        """Start worker `name` again (after it died, as a cluster's supervisor would), in its own group."""
        spec = next(w for w in self.workers if w.name == name)
        old = self.processes.get(name)
        if old is not None and old.poll() is None:
            raise RuntimeError(f"worker {name} still runs")
        self._spawn_worker(spec)

    def add_worker(self, spec: WorkerSpec) -> None:
        """Start one more worker while the job runs (it joins at a round boundary), at its own share."""
        if any(w.name == spec.name for w in self.workers):
            raise ValueError(f"worker names must be unique, repeated: {spec.name}")
        self.workers.append(spec)
        self.cpu.shares.append(spec.share)
        self.cpu.add(spec.name, spec.share)
        self._spawn_worker(spec)

    def restart_server(self, *extra_args: str) -> None:
        """Start the server again after it died (e.g. with --resume DIR), on the port it had: pass
        `--port N` among the server's flags, since workers reconnect to the address they were given."""
        if self.server is not None and self.server.poll() is None:
            raise RuntimeError("the server still runs")
        self._start_server(*extra_args)

    # --------------------------------------------------------------- control
    def plan(self) -> str:
        """One line saying how the heterogeneity is emulated (call after start())."""
        return self.cpu.describe([w.name for w in self.workers])

    def set_shares(self, shares: Sequence[float]) -> None:
        """Rewrite every worker's quota now (same period); RuntimeError under the slowdown fallback."""
        self.cpu.set_shares([w.name for w in self.workers], shares, running=self._started and not self._closed)

    def set_server_share(self, share: float) -> None:
        """Rewrite the server's quota now (only when it was started with a server_share under cgroups)."""
        self.cpu.set_server_share(share)

    # ------------------------------------------------------------- teardown
    def close(self) -> None:
        """Stop every process still running and remove every cgroup.

        Processes get SIGTERM and, after ``STOP_GRACE_S``, SIGKILL. Idempotent; tries every step even
        if one fails and raises the first error at the end; Ctrl-C or SIGTERM arriving meanwhile is
        held until the cleanup is done.
        """
        with signals_deferred():  # before the flag: a signal between the two skipped the cleanup for good
            with self._lock:
                if self._closed:
                    return
                self._closed = True
            self.procs.stop()
            errors = self.cpu.close()
            if errors:
                raise errors[0]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

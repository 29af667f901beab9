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

import contextlib
import functools
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Self

from deploy.cgroups import (
    CgroupBackend,
    CgroupError,
    CpuLimiter,
    cleanup_stale,
    detect_backend,
    slowdown_factors,
)
from deploy.profiles import quota_period_us
from deploy.run_files import event_of, last_line
from deploy.signals import HELD_SIGNALS, describe_status, parent_death_signal, signals_deferred
from ps.ops.metrics import read_metrics

LIMITERS = ("auto", "cgroup", "slowdown")
"""Ways to confine workers: a cgroup when one is writable (auto), a cgroup or fail, software slowdown."""
START_TIMEOUT_S = 60.0
"""How long the server may take to listen (it builds the model and dataset first)."""
STOP_GRACE_S = 2.0
"""How long processes get to exit after SIGTERM (close) or after the server (wait) before they are killed."""


class WorkerFailedError(RuntimeError):
    """A worker process exited with a non-zero status while the server was still running."""

    def __init__(self, failures: Sequence[tuple[str, int]], logs: dict[str, str]) -> None:
        self.failures = list(failures)
        described = ", ".join(f"{name} ({describe_status(code)})" for name, code in failures)
        tail = "; ".join(f"{name}: {text}" for name, text in logs.items() if text)
        super().__init__(
            f"worker {described} exited while the job was running, so the run was stopped (the cluster no "
            f"longer matches its profile)" + (f"; last log line: {tail}" if tail else "")
        )


class ServerStartError(RuntimeError):
    """The server exited before it listened (``returncode`` 2: it rejected its arguments)."""

    def __init__(self, message: str, returncode: int | None) -> None:
        super().__init__(message)
        self.returncode = returncode


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


class LocalCluster:
    """A ``ps-server`` process and one ``ps-worker`` process per :class:`WorkerSpec`, on 127.0.0.1.

    Use as a context manager; ``start()`` launches, ``wait()`` waits for the job, ``close()`` (also on
    ``__exit__``) kills whatever still runs and removes every cgroup. Logs go to ``workdir``:
    ``server.log``, ``<worker>.log``, and the metrics log ``metrics.jsonl``.
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
        if not workers:
            raise ValueError("a cluster needs at least one worker")
        names = [w.name for w in workers]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"worker names must be unique, repeated: {', '.join(duplicates)}")
        if limiter not in LIMITERS:
            raise ValueError(f"limiter must be one of {', '.join(LIMITERS)}, got {limiter!r}")
        if server_share is not None and (not math.isfinite(server_share) or server_share <= 0):
            raise ValueError(f"server_share must be a number of cores > 0, got {server_share!r}")
        shares = [w.share for w in workers] + ([server_share] if server_share is not None else [])
        self.server_args = list(server_args)
        self.workers = list(workers)
        self.workdir = Path(workdir)
        self.period_us = quota_period_us(shares) if period_us is None else period_us
        self.limiter = limiter
        self.server_share = server_share
        self.run_id = run_id
        self.quiet = quiet
        self.fast_start = fast_start
        self.shares = [w.share for w in workers]
        self.backend: CgroupBackend | None = None
        self.server: subprocess.Popen[bytes] | None = None
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.limiters: dict[str, CpuLimiter] = {}
        self.server_limiter: CpuLimiter | None = None
        self._logs: list[IO[bytes]] = []
        self._port: int | None = None
        self._limiting: str | None = None
        self._started = False
        self._closed = False
        self._lock = threading.Lock()
        self._settled = threading.Event()
        self._settle_error: BaseException | None = None

    # ---------------------------------------------------------------- setup
    def _resolve_backend(self) -> None:
        """Pick the cgroup backend (None: the slowdown fallback); CgroupError if 'cgroup' is impossible."""
        if self._limiting is not None:
            return
        backend = None if self.limiter == "slowdown" else detect_backend()
        if backend is None and self.limiter == "cgroup":
            raise CgroupError(
                "no writable cgroup CPU controller here (needs root on Linux with cgroup v2 cpu.max or "
                "v1 cpu.cfs_quota_us); use limiter 'slowdown' or 'auto'"
            )
        self.backend = backend
        self._limiting = "slowdown" if backend is None else f"cgroup-v{backend.version}"

    @property
    def slowdowns(self) -> list[float]:
        """The ``--slowdown`` factor of each worker under the slowdown fallback (max share / share)."""
        return slowdown_factors(self.shares)

    def plan(self) -> str:
        """One line saying how the heterogeneity is emulated (call after start())."""
        shares = ", ".join(f"{w.name}={s:.4g}" for w, s in zip(self.workers, self.shares, strict=True))
        if self.limiting == "slowdown":
            factors = ", ".join(f"{w.name}=x{f:.3g}" for w, f in zip(self.workers, self.slowdowns, strict=True))
            why = "forced by the slowdown limiter" if self.limiter == "slowdown" else "cgroups are not writable here"
            return (
                f"emulating with --slowdown ({why}): unlimited CPU, compute time multiplied by {factors} "
                f"(the ratios of shares {shares} cores)"
            )
        server = f", server {self.server_share:.4g}" if self.server_share is not None else ", server unlimited"
        return (
            f"emulating with {self.limiting} CPU quotas: {shares} cores{server}, "
            f"period {self.period_us / 1000:g} ms, quota reserved (a floor as well as a cap)"
        )

    def _open_log(self, name: str) -> IO[bytes]:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115
        self._logs.append(log)
        return log

    def _spawn(self, log_name: str, argv: list[str], limiter: CpuLimiter | None,
               record: Callable[[subprocess.Popen[bytes]], None]) -> None:
        """Start a process and `record` it where `close` looks (self.server, self.processes).

        SIGINT/SIGTERM/SIGHUP are held from before the fork until the process is recorded: raised
        in between (inside Popen, or before the assignment), they left a running child that `close`
        did not know of, and it outlived the cluster. The child unblocks them before exec.
        """
        arm = parent_death_signal()

        def preexec() -> None:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD_SIGNALS)
            arm()
            if limiter is not None:
                limiter.preexec()

        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        log = self._open_log(log_name)
        with signals_deferred():
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                preexec_fn=preexec, start_new_session=True,  # noqa: PLW1509 (raw syscalls only; see CpuLimiter.preexec)
            )
            record(proc)

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
        self._resolve_backend()
        if self.backend is not None:
            with contextlib.suppress(CgroupError, OSError):
                cleanup_stale(self.backend)
        port_file = self.workdir / "port"
        port_file.unlink(missing_ok=True)
        self.metrics_path.unlink(missing_ok=True)
        if self.backend is not None and self.server_share is not None:
            self.server_limiter = CpuLimiter.create(
                "server", self.server_share, self.period_us, run_id=self.run_id, backend=self.backend, reserve=True
            )
        argv = [
            sys.executable, "-m", "ps.server", "--port", "0", "--port-file", str(port_file),
            "--metrics-log", str(self.metrics_path), *self.server_args,
        ]
        self._spawn("server", argv, self.server_limiter, functools.partial(setattr, self, "server"))
        self._port = self._wait_for_port(port_file)
        factors = self.slowdowns
        boost = self.fast_start and self.backend is not None
        startup = max(1.0, *self.shares)
        for k, spec in enumerate(self.workers):
            limiter = None
            if self.backend is not None:
                limiter = CpuLimiter.create(
                    spec.name, startup if boost else spec.share, self.period_us,
                    run_id=self.run_id, backend=self.backend, reserve=True,
                )
                self.limiters[spec.name] = limiter
            argv = [
                sys.executable, "-m", "worker.cli", "--server", self.target, "--name", spec.name,
                "--cores", repr(float(spec.share)), "--threads", str(spec.threads),
                "--device", "cpu",  # the emulated differences are CPU quotas; extra_args may name a GPU
            ]
            if self.backend is None and factors[k] != 1.0:
                argv += ["--slowdown", repr(factors[k])]
            if self.quiet:
                argv.append("--quiet")
            argv += list(spec.extra_args)
            self._spawn(spec.name, argv, limiter, functools.partial(self.processes.__setitem__, spec.name))
        if boost:
            threading.Thread(target=self._settle_when_job_starts, name="cluster-settle", daemon=True).start()
        else:
            self._settled.set()

    def _settle_when_job_starts(self) -> None:
        """Background: at the job's first ``adjust`` event, drop every worker from its startup quota."""
        # SIGINT/SIGTERM/SIGHUP go to the main thread, which handles them (and defers them, see
        # signals_deferred); taken here, a signal's handler could run late, outside a deferred block
        signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
        offset, pending = 0, b""
        try:
            while not self._closed:
                with contextlib.suppress(FileNotFoundError), open(self.metrics_path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
                    offset += len(chunk)
                    pending += chunk
                *lines, pending = pending.split(b"\n")
                if any(event_of(line) == "adjust" for line in lines):
                    break
                if self.server is not None and self.server.poll() is not None:
                    break
                time.sleep(0.02)
            with self._lock:
                if not self._closed and not self._settled.is_set():
                    for spec, share in zip(self.workers, self.shares, strict=True):
                        self.limiters[spec.name].set(share)
        except Exception as exc:  # noqa: BLE001 (reported by check_workers() / wait())
            self._settle_error = exc
        finally:
            self._settled.set()

    def wait_settled(self, timeout: float | None = None) -> bool:
        """Wait until every worker runs at its own share (at once without fast_start); False on timeout."""
        return self._settled.wait(timeout)

    def _wait_for_port(self, port_file: Path) -> int:
        deadline = time.monotonic() + START_TIMEOUT_S
        assert self.server is not None
        while True:
            with contextlib.suppress(OSError, ValueError):
                text = port_file.read_text().strip()
                if text:
                    return int(text)
            code = self.server.poll()
            if code is not None:
                raise ServerStartError(
                    f"the server exited ({describe_status(code)}) before listening: "
                    f"{last_line(self.workdir / 'server.log') or 'no output'}",
                    code,
                )
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"the server did not listen within {START_TIMEOUT_S:g} s (see {self.workdir / 'server.log'})", None
                )
            time.sleep(0.05)

    # ------------------------------------------------------------ properties
    @property
    def limiting(self) -> str:
        """How workers are confined: ``cgroup-v1``, ``cgroup-v2`` or ``slowdown`` (probes before start())."""
        self._resolve_backend()
        assert self._limiting is not None
        return self._limiting

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

    # --------------------------------------------------------------- control
    def set_shares(self, shares: Sequence[float]) -> None:
        """Rewrite every worker's quota now (same period); RuntimeError under the slowdown fallback."""
        shares = [float(s) for s in shares]
        if len(shares) != len(self.workers):
            raise ValueError(f"expected {len(self.workers)} shares, one per worker, got {len(shares)}")
        for share in shares:
            if not math.isfinite(share) or share <= 0:
                raise ValueError(f"every share must be a number of cores > 0, got {share!r}")
        if self.limiting == "slowdown":
            raise RuntimeError(
                "the slowdown fallback cannot change a worker's speed while it runs (--slowdown is fixed at "
                "start); changing shares needs a writable cgroup CPU controller"
            )
        if not self._started or self._closed:
            raise RuntimeError("set_shares() needs a running cluster")
        with self._lock:
            for spec, share in zip(self.workers, shares, strict=True):
                self.limiters[spec.name].set(share)
            self.shares = shares
            self._settled.set()

    def set_server_share(self, share: float) -> None:
        """Rewrite the server's quota now (only when it was started with a server_share under cgroups)."""
        if self.server_limiter is None:
            raise RuntimeError("the server has no quota to change (no server_share, or the slowdown fallback)")
        self.server_limiter.set(share)
        self.server_share = share

    def quotas(self) -> dict[str, tuple[int | None, int]]:
        """The ``(quota_us, period_us)`` the kernel holds for each worker's group now."""
        return {name: limiter.limit() for name, limiter in self.limiters.items()}

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

    def failed_workers(self) -> list[tuple[str, int]]:
        """Workers that have exited with a non-zero status, as ``(name, status)``."""
        return [(n, p.returncode) for n, p in self.processes.items() if p.poll() not in (None, 0)]

    def check_workers(self) -> None:
        """Raise :class:`WorkerFailedError` if a worker died while the server still runs.

        Also raises the error that kept the startup quota from dropping to the shares (fast_start).
        """
        if self._settle_error is not None:
            raise RuntimeError(f"could not apply the workers' quotas when the job started: {self._settle_error}")
        if self.server is None or self.server.poll() is not None:
            return
        failed = self.failed_workers()
        if failed:
            raise WorkerFailedError(failed, {n: last_line(self.workdir / f"{n}.log") for n, _ in failed})

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the server to exit and return its status; TimeoutError after ``timeout`` seconds.

        Raises :class:`WorkerFailedError` as soon as a worker exits non-zero while the server runs
        (the server would wait for it, or evict it and go on with a cluster that no longer matches
        the profile). Workers get ``STOP_GRACE_S`` to exit after the server.
        """
        if self.server is None:
            raise RuntimeError("the cluster has not started")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self.check_workers()
            code = self.server.poll()
            if code is not None:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"the server did not finish within {timeout:g} s")
            time.sleep(0.1)
        end = time.monotonic() + STOP_GRACE_S
        for proc in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, end - time.monotonic()))
        return code

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
            self._close()

    def _close(self) -> None:
        errors: list[BaseException] = []
        running = [p for p in [*self.processes.values(), self.server] if p is not None and p.poll() is None]
        for proc in running:
            with contextlib.suppress(OSError):
                proc.terminate()
        end = time.monotonic() + STOP_GRACE_S
        for proc in running:
            try:
                proc.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    proc.kill()
        for proc in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        for limiter in [*self.limiters.values(), *([self.server_limiter] if self.server_limiter else [])]:
            try:
                limiter.close()
            except (CgroupError, OSError) as exc:
                errors.append(exc)
        for log in self._logs:
            with contextlib.suppress(OSError):
                log.close()
        if errors:
            raise errors[0]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

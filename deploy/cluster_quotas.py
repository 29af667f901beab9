"""How a local cluster's processes are confined: one CPU quota per process (a cgroup, v2 or v1), or,
where no cgroup CPU controller is writable, ``--slowdown`` factors with the same ratios.

:class:`CpuQuotas` picks the way once, creates each process's group (reserved: the quota is a floor as
well as a cap), rewrites quotas while the job runs, and with ``fast_start`` lets workers start at a
full core or more until the job's first ``adjust`` event drops them to their own shares.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from deploy.cgroups import CgroupBackend, CgroupError, CpuLimiter, cleanup_stale, detect_backend, slowdown_factors
from deploy.profiles import quota_period_us
from deploy.run_files import event_of
from deploy.signals import HELD_SIGNALS

LIMITERS = ("auto", "cgroup", "slowdown")
"""Ways to confine workers: a cgroup when one is writable (auto), a cgroup or fail, software slowdown."""


class CpuQuotas:
    """The workers' (and optionally the server's) CPU quotas, by name, or their slowdown factors."""

    def __init__(self, shares: Sequence[float], period_us: int | None, limiter: str, server_share: float | None,
                 run_id: str) -> None:
        """``period_us`` None: the longest period that gives every share (the server's too) a 1 ms quota."""
        if limiter not in LIMITERS:
            raise ValueError(f"limiter must be one of {', '.join(LIMITERS)}, got {limiter!r}")
        if server_share is not None and (not math.isfinite(server_share) or server_share <= 0):
            raise ValueError(f"server_share must be a number of cores > 0, got {server_share!r}")
        everything = [*shares, *([server_share] if server_share is not None else [])]
        self.period_us = quota_period_us(everything) if period_us is None else period_us
        self.shares = list(shares)
        self.limiter = limiter
        self.server_share = server_share
        self.run_id = run_id
        self.backend: CgroupBackend | None = None
        self.limiters: dict[str, CpuLimiter] = {}
        self.server_limiter: CpuLimiter | None = None
        self.lock = threading.Lock()
        self.settled = threading.Event()
        self.settle_error: BaseException | None = None
        self._limiting: str | None = None

    @property
    def limiting(self) -> str:
        """``cgroup-v1``, ``cgroup-v2`` or ``slowdown``; CgroupError if limiter 'cgroup' is impossible."""
        if self._limiting is None:
            backend = None if self.limiter == "slowdown" else detect_backend()
            if backend is None and self.limiter == "cgroup":
                raise CgroupError(
                    "no writable cgroup CPU controller here (needs root on Linux with cgroup v2 cpu.max or "
                    "v1 cpu.cfs_quota_us); use limiter 'slowdown' or 'auto'"
                )
            self.backend = backend
            self._limiting = "slowdown" if backend is None else f"cgroup-v{backend.version}"
        return self._limiting

    @property
    def slowdowns(self) -> list[float]:
        """The ``--slowdown`` factor of each worker under the slowdown fallback (max share / share)."""
        return slowdown_factors(self.shares)

    def describe(self, names: Sequence[str]) -> str:
        """One line saying how the heterogeneity is emulated."""
        shares = ", ".join(f"{n}={s:.4g}" for n, s in zip(names, self.shares, strict=True))
        if self.limiting == "slowdown":
            factors = ", ".join(f"{n}=x{f:.3g}" for n, f in zip(names, self.slowdowns, strict=True))
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

    def clean_stale(self) -> None:
        """Pick the backend and remove the groups that a killed run left behind under it."""
        if self.limiting == "slowdown" or self.backend is None:
            return
        with contextlib.suppress(CgroupError, OSError):
            cleanup_stale(self.backend)

    def add_server(self) -> CpuLimiter | None:
        """Create the server's group at its share (None without a server_share or under the slowdown fallback)."""
        if self.backend is not None and self.server_share is not None:
            self.server_limiter = self._create("server", self.server_share)
        return self.server_limiter

    def add(self, name: str, share: float) -> CpuLimiter | None:
        """Create worker ``name``'s group at ``share`` cores (None under the slowdown fallback)."""
        if self.backend is None:
            return None
        self.limiters[name] = self._create(name, share)
        return self.limiters[name]

    def _create(self, name: str, share: float) -> CpuLimiter:
        return CpuLimiter.create(name, share, self.period_us, run_id=self.run_id, backend=self.backend, reserve=True)

    def settle_in_background(self, names: Sequence[str], metrics_path: Path, server_exited: Callable[[], bool],
                             closed: Callable[[], bool]) -> None:
        """Start the thread that drops every worker to its share when the job starts (fast_start)."""
        threading.Thread(target=self._settle_when_job_starts, name="cluster-settle", daemon=True,
                         args=(names, metrics_path, server_exited, closed)).start()

    def _settle_when_job_starts(self, names: Sequence[str], metrics_path: Path, server_exited: Callable[[], bool],
                               closed: Callable[[], bool]) -> None:
        """Background: at the job's first ``adjust`` event, drop every worker from its startup quota."""
        # SIGINT/SIGTERM/SIGHUP go to the main thread, which handles them (and defers them, see
        # signals_deferred); taken here, a signal's handler could run late, outside a deferred block
        signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
        offset, pending = 0, b""
        try:
            while not closed():
                with contextlib.suppress(FileNotFoundError), open(metrics_path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
                    offset += len(chunk)
                    pending += chunk
                *lines, pending = pending.split(b"\n")
                if any(event_of(line) == "adjust" for line in lines):
                    break
                if server_exited():
                    break
                time.sleep(0.02)
            with self.lock:
                if not closed() and not self.settled.is_set():
                    for name, share in zip(names, self.shares, strict=True):
                        self.limiters[name].set(share)
        except Exception as exc:  # noqa: BLE001 (reported by check_workers() / wait())
            self.settle_error = exc
        finally:
            self.settled.set()

    def set_shares(self, names: Sequence[str], shares: Sequence[float], *, running: bool) -> None:
        """Rewrite every worker's quota now (same period); RuntimeError under the slowdown fallback."""
        shares = [float(s) for s in shares]
        if len(shares) != len(names):
            raise ValueError(f"expected {len(names)} shares, one per worker, got {len(shares)}")
        for share in shares:
            if not math.isfinite(share) or share <= 0:
                raise ValueError(f"every share must be a number of cores > 0, got {share!r}")
        if self.limiting == "slowdown":
            raise RuntimeError(
                "the slowdown fallback cannot change a worker's speed while it runs (--slowdown is fixed at "
                "start); changing shares needs a writable cgroup CPU controller"
            )
        if not running:
            raise RuntimeError("set_shares() needs a running cluster")
        with self.lock:
            for name, share in zip(names, shares, strict=True):
                self.limiters[name].set(share)
            self.shares = shares
            self.settled.set()

    def set_server_share(self, share: float) -> None:
        """Rewrite the server's quota now (only when it was started with a server_share under cgroups)."""
        if self.server_limiter is None:
            raise RuntimeError("the server has no quota to change (no server_share, or the slowdown fallback)")
        self.server_limiter.set(share)
        self.server_share = share

    def held(self) -> dict[str, tuple[int | None, int]]:
        """The ``(quota_us, period_us)`` the kernel holds for each worker's group now."""
        return {name: limiter.limit() for name, limiter in self.limiters.items()}

    def close(self) -> list[BaseException]:
        """Remove every group; the errors met on the way (each group is tried)."""
        errors: list[BaseException] = []
        for limiter in [*self.limiters.values(), *([self.server_limiter] if self.server_limiter else [])]:
            try:
                limiter.close()
            except (CgroupError, OSError) as exc:
                errors.append(exc)
        return errors

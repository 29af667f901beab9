"""CPU-time quotas for emulated workers, through Linux cgroups (v2 ``cpu.max`` or v1 CFS files).

A :class:`CpuLimiter` is one worker's group: ``create`` makes it with a quota of ``cores`` CPUs,
``set`` rewrites the quota while the worker runs (dynamic heterogeneity), ``preexec`` puts a child
process into the group before it execs, and ``close`` moves any tasks out and removes the group.

Groups live under one dedicated parent, ``hetero-ps/<run>/<worker>``, where ``<run>`` also records
the owner's pid and start time so that :func:`cleanup_stale` can tell a dead run's leftovers from a
live one's. Every quota is read back after it is written: the kernel refuses some values (a quota
or period under 1 ms), and a refused write that went unnoticed would leave a worker silently
unthrottled. The hierarchies (v2, v1) are :mod:`deploy.cgroup_backends`, the control files and group
directories :mod:`deploy.cgroup_files`.

Where no backend is writable (:func:`detect_backend` returns None), callers fall back to slowing
workers down in software with :func:`slowdown_factors`, which keeps the same ratios.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import secrets
from pathlib import Path

from deploy.cgroup_backends import PARENT, CgroupBackend, backends
from deploy.cgroup_files import CgroupError, group_pids, remove_group, start_ticks, write_control

__all__ = [
    "MAX_PERIOD_US", "MIN_PERIOD_US", "MIN_QUOTA_US", "PARENT", "CgroupBackend", "CgroupError", "CpuLimiter",
    "backends", "cleanup_stale", "detect_backend", "slowdown_factors",
]

MIN_QUOTA_US = 1_000
"""The kernel refuses a CFS quota under 1 ms."""
MIN_PERIOD_US = 1_000
"""The kernel refuses a CFS period under 1 ms."""
MAX_PERIOD_US = 1_000_000
"""The kernel refuses a CFS period over 1 s."""

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,63}$")
_RUN_DIR = re.compile(r"^(?P<run>[A-Za-z0-9_][A-Za-z0-9_-]*)\.(?P<pid>\d+)\.(?P<start>\d+)$")


def _check_name(kind: str, name: str) -> None:
    """Accept names that are safe as one cgroup directory level."""
    if not _NAME.match(name):
        raise ValueError(
            f"invalid {kind} {name!r}: use 1-64 letters, digits, '_' or '-', not starting with '-'"
        )


def _check_limit(cores: float, period_us: int) -> int:
    """Validate a limit and return its quota in microseconds."""
    if not isinstance(cores, (int, float)) or isinstance(cores, bool) or not math.isfinite(cores):
        raise ValueError(f"cores must be a finite number, got {cores!r}")
    if cores <= 0:
        raise ValueError(f"cores must be > 0, got {cores}")
    if not isinstance(period_us, int) or not MIN_PERIOD_US <= period_us <= MAX_PERIOD_US:
        raise ValueError(
            f"period_us must be an integer in [{MIN_PERIOD_US}, {MAX_PERIOD_US}], got {period_us!r}"
        )
    quota = round(cores * period_us)
    if quota < MIN_QUOTA_US:
        needed = math.ceil(MIN_QUOTA_US / cores - 1e-6)
        raise ValueError(
            f"{cores} cores over a {period_us} us period is a {quota} us quota, under the kernel's "
            f"1 ms minimum; use a period of at least {needed} us "
            "(deploy.profiles.quota_period_us computes one for a set of shares)"
        )
    return quota


class CpuLimiter:
    """One worker's CPU quota: a cgroup whose tasks together get at most ``cores`` CPUs."""

    def __init__(self, backend: CgroupBackend, path: Path, cores: float, period_us: int) -> None:
        """Wrap an existing group; use :meth:`create` to make one."""
        self.backend = backend
        self.path = path
        self.cores = cores
        self.period_us = period_us
        self._procs = os.fsencode(path / "cgroup.procs")
        self._closed = False

    @classmethod
    def create(
        cls,
        name: str,
        cores: float,
        period_us: int,
        *,
        run_id: str = "run",
        backend: CgroupBackend | None = None,
        reserve: bool = False,
    ) -> CpuLimiter:
        """Create group ``hetero-ps/<run_id>.<pid>.<start>/<name>`` limited to ``cores`` CPUs.

        ``period_us`` must leave a quota of at least 1 ms (see ``deploy.profiles.quota_period_us``).
        ``backend`` defaults to :func:`detect_backend`; CgroupError if none is writable.
        ``reserve`` also gives the group (and its run and ``hetero-ps`` parents) the largest CPU
        weight: the quota is then a floor as well as a cap, as on a dedicated machine, even while
        other processes keep the CPUs busy. Keep the sum of reserved quotas under the CPU count.
        """
        _check_name("worker name", name)
        _check_name("run id", run_id)
        quota = _check_limit(cores, period_us)
        backend = backend or detect_backend()
        if backend is None:
            raise CgroupError(
                "no writable cgroup CPU controller (v2 cpu.max or v1 cpu.cfs_quota_us); "
                "run as root on Linux, or fall back to slowdown_factors()"
            )
        pid = os.getpid()
        path = backend.parent / f"{run_id}.{pid}.{start_ticks(pid)}" / name
        try:
            backend.make_group(path)
        except FileExistsError:
            raise CgroupError(f"group {path} already exists: worker names must be unique in a run") from None
        limiter = cls(backend, path, cores, period_us)
        try:
            if reserve:
                for group in (backend.parent, path.parent, path):
                    backend.reserve(group)
            limiter._apply(quota, period_us)
        except BaseException:
            limiter.close()
            raise
        return limiter

    def _apply(self, quota_us: int, period_us: int) -> None:
        """Write a limit and check that the kernel holds exactly that value."""
        self.backend.write_limit(self.path, quota_us, period_us)
        held = self.backend.read_limit(self.path)
        if held != (quota_us, period_us):
            raise CgroupError(
                f"{self.path} holds quota/period {held} after writing {(quota_us, period_us)}"
            )

    def set(self, cores: float, period_us: int | None = None) -> None:
        """Change the quota while the group's tasks run; keeps the period unless one is given."""
        if self._closed:
            raise CgroupError(f"{self.path} is closed")
        period = self.period_us if period_us is None else period_us
        self._apply(_check_limit(cores, period), period)
        self.cores, self.period_us = cores, period

    def limit(self) -> tuple[int | None, int]:
        """The ``(quota_us, period_us)`` the kernel holds now."""
        return self.backend.read_limit(self.path)

    def add_pid(self, pid: int) -> None:
        """Move a running process (all its threads) into the group."""
        write_control(self.path / "cgroup.procs", str(pid))
        if pid not in self.pids():
            raise CgroupError(f"pid {pid} is not in {self.path} after writing it to cgroup.procs")

    def preexec(self) -> None:
        """Put the calling process into the group: pass as ``subprocess.Popen(preexec_fn=...)``.

        It runs in the forked child before exec, so the worker never runs unthrottled. It uses only
        raw system calls; a refusal raises, and Popen then fails in the parent.
        """
        fd = os.open(self._procs, os.O_WRONLY)
        try:
            os.write(fd, b"%d" % os.getpid())
        finally:
            os.close(fd)

    def pids(self) -> list[int]:
        """The processes in the group now."""
        return group_pids(self.path)

    def close(self) -> None:
        """Move remaining tasks back to the owner's group and remove this group (and an empty run).

        Idempotent and quiet about a group that is already gone, so it is safe on every exit path.
        """
        if self._closed:
            return
        remove_group(self.path, self.backend.home)
        self._closed = True
        with contextlib.suppress(OSError):
            os.rmdir(self.path.parent)

    def __enter__(self) -> CpuLimiter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CpuLimiter({str(self.path)!r}, cores={self.cores}, period_us={self.period_us})"


def works(backend: CgroupBackend) -> bool:
    """Whether a group can be created, limited and removed under ``backend`` (tried on a scratch group)."""
    try:
        run_id = f"probe-{secrets.token_hex(4)}"
        limiter = CpuLimiter.create("probe", 1.0, 100_000, run_id=run_id, backend=backend)
    except (CgroupError, OSError):
        return False
    try:
        limiter.close()
    except (CgroupError, OSError):
        return False
    return True


def detect_backend() -> CgroupBackend | None:
    """The first backend where a scratch group can really be created and limited, or None."""
    for backend in backends():
        if works(backend):
            return backend
    return None


def cleanup_stale(backend: CgroupBackend | None = None) -> list[Path]:
    """Remove the groups of runs whose owner process is gone; return the run directories removed.

    A run directory is named ``<run>.<pid>.<start>``; it is stale when no process with that pid and
    start time exists. Processes still inside (orphaned workers) are moved to this process's group.
    """
    removed: list[Path] = []
    for candidate in [backend] if backend is not None else backends():
        if not candidate.parent.is_dir():
            continue
        for run_dir in sorted(p for p in candidate.parent.iterdir() if p.is_dir()):
            match = _RUN_DIR.match(run_dir.name)
            if match is None:
                continue
            if start_ticks(int(match["pid"])) == int(match["start"]):
                continue
            remove_group(run_dir, candidate.home)
            removed.append(run_dir)
    return removed


def slowdown_factors(shares: list[float]) -> list[float]:
    """Software slowdowns with the ratios of ``shares``: the largest share runs at 1, others slower.

    Factor k is ``max(shares) / shares[k]``: a worker with a quarter of the largest share takes 4x as
    long per sample. This is the fallback where no cgroup backend is writable.
    """
    if not shares:
        raise ValueError("shares must not be empty")
    for share in shares:
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not math.isfinite(share) or share <= 0:
            raise ValueError(f"every share must be a finite number > 0, got {share!r}")
    top = max(shares)
    return [top / share for share in shares]

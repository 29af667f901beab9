"""CPU-time quotas for emulated workers, through Linux cgroups (v2 ``cpu.max`` or v1 CFS files).

A :class:`CpuLimiter` is one worker's group: ``create`` makes it with a quota of ``cores`` CPUs,
``set`` rewrites the quota while the worker runs (dynamic heterogeneity), ``preexec`` puts a child
process into the group before it execs, and ``close`` moves any tasks out and removes the group.

Groups live under one dedicated parent, ``hetero-ps/<run>/<worker>``, where ``<run>`` also records
the owner's pid and start time so that :func:`cleanup_stale` can tell a dead run's leftovers from a
live one's. Every control file is written with an explicit open/write/close and read back: the
kernel refuses some values (a quota or period under 1 ms), and a refused write that went unnoticed
would leave a worker silently unthrottled.

Where no backend is writable (:func:`detect_backend` returns None), callers fall back to slowing
workers down in software with :func:`slowdown_factors`, which keeps the same ratios.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import re
import secrets
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from deploy.proc_stat import read_proc_stat

MIN_QUOTA_US = 1_000
"""The kernel refuses a CFS quota under 1 ms."""
MIN_PERIOD_US = 1_000
"""The kernel refuses a CFS period under 1 ms."""
MAX_PERIOD_US = 1_000_000
"""The kernel refuses a CFS period over 1 s."""
MAX_SHARES_V1 = 262_144
"""The largest v1 ``cpu.shares`` (default 1024)."""
MAX_WEIGHT_V2 = 10_000
"""The largest v2 ``cpu.weight`` (default 100)."""
PARENT = "hetero-ps"
"""The directory, under the hierarchy's root, that holds every group this package creates."""

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,63}$")
_RUN_DIR = re.compile(r"^(?P<run>[A-Za-z0-9_][A-Za-z0-9_-]*)\.(?P<pid>\d+)\.(?P<start>\d+)$")
_RMDIR_TIMEOUT_S = 2.0


class CgroupError(RuntimeError):
    """A cgroup operation the kernel refused or did not apply."""


@dataclass(frozen=True)
class _Mount:
    """Where one cgroup hierarchy is mounted and where this process sits in it."""

    mount_point: Path
    home: Path


def _write(path: Path, value: str) -> None:
    """Write a control file with an explicit open/write/close so that a refusal raises here."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError as exc:
        raise CgroupError(f"cannot open {path} for writing: {exc.strerror}") from exc
    try:
        os.write(fd, value.encode())
    except OSError as exc:
        raise CgroupError(f"the kernel refused {value!r} in {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)


def _read(path: Path) -> str:
    """Read a control file's value."""
    with open(path, encoding="ascii") as f:
        return f.read().strip()


def _write_checked(path: Path, value: str) -> None:
    """Write a single-value control file and check that the kernel holds that value."""
    _write(path, value)
    held = _read(path)
    if held != value:
        raise CgroupError(f"{path} holds {held!r} after writing {value!r}")


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


def _start_ticks(pid: int) -> int | None:
    """A live process's start time in clock ticks since boot; None if it is gone or a zombie.

    With the pid it identifies a process even after the pid is reused.
    """
    stat = read_proc_stat(pid)
    return None if stat is None or stat.state in ("Z", "X") else stat.start_ticks


def _pids(group: Path) -> list[int]:
    """The processes in a group (empty if the group is gone)."""
    try:
        return [int(line) for line in _read(group / "cgroup.procs").split()]
    except FileNotFoundError:
        return []


def _move_out(group: Path, home: Path) -> None:
    """Move every process of ``group`` to ``home``; processes that exit meanwhile are fine."""
    for pid in _pids(group):
        try:
            _write(home / "cgroup.procs", str(pid))
        except CgroupError as exc:
            if _start_ticks(pid) is not None:
                raise CgroupError(f"cannot move pid {pid} out of {group} to {home}: {exc}") from exc


def _remove(group: Path, home: Path) -> None:
    """Empty and remove a group and its subgroups; a group that is already gone is fine."""
    if not group.is_dir():
        return
    for child in sorted(p for p in group.iterdir() if p.is_dir()):
        _remove(child, home)
    deadline = time.monotonic() + _RMDIR_TIMEOUT_S
    while True:
        _move_out(group, home)
        try:
            os.rmdir(group)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise CgroupError(
                    f"cannot remove {group}: {exc.strerror} (processes still in it: {_pids(group)})"
                ) from exc
            time.sleep(0.01)


class CgroupBackend(ABC):
    """One cgroup hierarchy with a writable CPU controller: where groups go and how limits are set."""

    version: int

    def __init__(self, mount: _Mount) -> None:
        self.mount_point = mount.mount_point
        self.home = mount.home
        self.parent = mount.mount_point / PARENT

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.mount_point)!r})"

    @abstractmethod
    def enable_cpu(self, group: Path) -> None:
        """Make the CPU controller available to the children of ``group``."""

    @abstractmethod
    def write_limit(self, group: Path, quota_us: int, period_us: int) -> None:
        """Write a quota and period to ``group``'s control files."""

    @abstractmethod
    def read_limit(self, group: Path) -> tuple[int | None, int]:
        """Read ``(quota_us, period_us)`` back; quota None means unlimited."""

    @abstractmethod
    def reserve(self, group: Path) -> None:
        """Give ``group`` the largest CPU weight, so that busy siblings cannot take its quota."""

    def make_group(self, path: Path) -> None:
        """Create the new group ``path`` and its missing ancestors, with the CPU controller on.

        FileExistsError if ``path`` itself exists already.
        """
        ancestors = list(reversed(path.parents[: path.parents.index(self.mount_point)]))
        self.enable_cpu(self.mount_point)
        try:
            for directory in ancestors:
                directory.mkdir(exist_ok=True)
                self.enable_cpu(directory)
            path.mkdir()
        except FileExistsError:
            raise
        except OSError as exc:
            raise CgroupError(f"cannot create cgroup {path}: {exc.strerror}") from exc

    def probe(self) -> bool:
        """Whether a group can be created, limited and removed here (tried on a scratch group)."""
        try:
            run_id = f"probe-{secrets.token_hex(4)}"
            limiter = CpuLimiter.create("probe", 1.0, 100_000, run_id=run_id, backend=self)
        except (CgroupError, OSError):
            return False
        try:
            limiter.close()
        except (CgroupError, OSError):
            return False
        return True


class CgroupV2Backend(CgroupBackend):
    """cgroup v2: ``cpu.max`` holds "quota period"; controllers are enabled per subtree."""

    version = 2

    def enable_cpu(self, group: Path) -> None:
        control = group / "cgroup.subtree_control"
        if "cpu" in _read(control).split():
            return
        if "cpu" not in _read(group / "cgroup.controllers").split():
            raise CgroupError(f"the cpu controller is not available in {group} (cgroup.controllers)")
        _write(control, "+cpu")
        if "cpu" not in _read(control).split():
            raise CgroupError(f"writing +cpu to {control} did not enable the cpu controller")

    def write_limit(self, group: Path, quota_us: int, period_us: int) -> None:
        _write(group / "cpu.max", f"{quota_us} {period_us}")

    def read_limit(self, group: Path) -> tuple[int | None, int]:
        quota, period = _read(group / "cpu.max").split()
        return (None if quota == "max" else int(quota)), int(period)

    def reserve(self, group: Path) -> None:
        _write_checked(group / "cpu.weight", str(MAX_WEIGHT_V2))


class CgroupV1Backend(CgroupBackend):
    """cgroup v1: the cpu controller's ``cpu.cfs_period_us`` and ``cpu.cfs_quota_us``."""

    version = 1

    def enable_cpu(self, group: Path) -> None:
        """Nothing to do: every v1 group of the cpu hierarchy has the controller."""

    def write_limit(self, group: Path, quota_us: int, period_us: int) -> None:
        _write(group / "cpu.cfs_period_us", str(period_us))
        _write(group / "cpu.cfs_quota_us", str(quota_us))

    def read_limit(self, group: Path) -> tuple[int | None, int]:
        quota = int(_read(group / "cpu.cfs_quota_us"))
        return (None if quota < 0 else quota), int(_read(group / "cpu.cfs_period_us"))

    def reserve(self, group: Path) -> None:
        _write_checked(group / "cpu.shares", str(MAX_SHARES_V1))


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
        path = backend.parent / f"{run_id}.{pid}.{_start_ticks(pid)}" / name
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
        _write(self.path / "cgroup.procs", str(pid))
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
        return _pids(self.path)

    def close(self) -> None:
        """Move remaining tasks back to the owner's group and remove this group (and an empty run).

        Idempotent and quiet about a group that is already gone, so it is safe on every exit path.
        """
        if self._closed:
            return
        _remove(self.path, self.backend.home)
        self._closed = True
        with contextlib.suppress(OSError):
            os.rmdir(self.path.parent)

    def __enter__(self) -> CpuLimiter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CpuLimiter({str(self.path)!r}, cores={self.cores}, period_us={self.period_us})"


def _mounts() -> tuple[_Mount | None, _Mount | None]:
    """The cgroup v2 mount and the v1 cpu-controller mount of this process, where present."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            mountinfo = f.read().splitlines()
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            membership = f.read().splitlines()
    except OSError:
        return None, None
    paths: dict[str, str] = {}
    for line in membership:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            paths["v2"] = path
        elif "cpu" in controllers.split(","):
            paths["v1"] = path
    found: dict[str, _Mount] = {}
    for line in mountinfo:
        fields, _, tail = line.partition(" - ")
        fstype, _, options = [*tail.split(), "", "", ""][:3]
        parts = fields.split()
        root, mount_point = parts[3], Path(parts[4])
        key = "v2" if fstype == "cgroup2" else "v1" if fstype == "cgroup" and "cpu" in options.split(",") else None
        if key is None or key in found or key not in paths:
            continue
        relative = os.path.relpath(paths[key], root)
        home = mount_point if relative.startswith("..") else (mount_point / relative).resolve()
        found[key] = _Mount(mount_point, home)
    return found.get("v2"), found.get("v1")


def backends() -> list[CgroupBackend]:
    """The cgroup hierarchies of this process that carry a CPU controller, v2 first (unprobed)."""
    v2, v1 = _mounts()
    found: list[CgroupBackend] = []
    if v2 is not None:
        controllers = v2.mount_point / "cgroup.controllers"
        if controllers.exists() and "cpu" in _read(controllers).split():
            found.append(CgroupV2Backend(v2))
    if v1 is not None and (v1.mount_point / "cpu.cfs_quota_us").exists():
        found.append(CgroupV1Backend(v1))
    return found


def detect_backend() -> CgroupBackend | None:
    """The first backend where a scratch group can really be created and limited, or None."""
    for backend in backends():
        if backend.probe():
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
            if _start_ticks(int(match["pid"])) == int(match["start"]):
                continue
            _remove(run_dir, candidate.home)
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

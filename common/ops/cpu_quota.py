"""The CPUs this process may use: its affinity, and the CPU quota of the cgroups it sits in (v2
``cpu.max``, v1 ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``; the tightest along the path up to the
hierarchy's root). A container run with ``--cpus 0.5`` or a Kubernetes CPU limit sees every core of
its host in its affinity but may use half of one: the quota is what a worker's default declared cores
(the static start's weights) should say. Deploy's emulator writes the same files
(deploy.cgroup_backends)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Mount:
    """Where one cgroup hierarchy is mounted and where this process sits in it."""

    mount_point: Path
    home: Path


def mounts(mountinfo: Path = Path("/proc/self/mountinfo"),
           cgroup: Path = Path("/proc/self/cgroup")) -> tuple[Mount | None, Mount | None]:
    """The cgroup v2 mount and the v1 cpu-controller mount of this process, where present."""
    try:
        lines = mountinfo.read_text(encoding="utf-8").splitlines()
        membership = cgroup.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None, None
    paths: dict[str, str] = {}
    for line in membership:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            paths["v2"] = path
        elif "cpu" in controllers.split(","):
            paths["v1"] = path
    found: dict[str, Mount] = {}
    for line in lines:
        fields, _, tail = line.partition(" - ")
        fstype, _, options = [*tail.split(), "", "", ""][:3]
        parts = fields.split()
        if len(parts) < 5:
            continue
        root, mount_point = parts[3], Path(parts[4])
        key = "v2" if fstype == "cgroup2" else "v1" if fstype == "cgroup" and "cpu" in options.split(",") else None
        if key is None or key in found or key not in paths:
            continue
        relative = os.path.relpath(paths[key], root)
        home = mount_point if relative.startswith("..") else (mount_point / relative).resolve()
        found[key] = Mount(mount_point, home)
    return found.get("v2"), found.get("v1")


def _limit_v2(group: Path) -> float | None:
    quota, period = group.joinpath("cpu.max").read_text().split()
    return None if quota == "max" else int(quota) / int(period)


def _limit_v1(group: Path) -> float | None:
    quota = int(group.joinpath("cpu.cfs_quota_us").read_text())
    return None if quota < 0 else quota / int(group.joinpath("cpu.cfs_period_us").read_text())


def cpu_quota(found: tuple[Mount | None, Mount | None] | None = None) -> float | None:
    """The tightest CPU quota, in CPUs, of this process's cgroups and their ancestors (both
    hierarchies); None where none is set or none can be read."""
    v2, v1 = mounts() if found is None else found
    limits: list[float] = []
    for mount, read in ((v2, _limit_v2), (v1, _limit_v1)):
        if mount is None:
            continue
        group = mount.home
        while True:
            try:
                limit = read(group)
            except (OSError, ValueError, ZeroDivisionError):
                limit = None
            if limit is not None and limit > 0:
                limits.append(limit)
            if group == mount.mount_point or mount.mount_point not in group.parents:
                break
            group = group.parent
    return min(limits, default=None)


def usable_cpus() -> float:
    """The CPUs this process may run on (its affinity), no more than its cgroups' CPU quota."""
    try:
        affinity = float(len(os.sched_getaffinity(0)))
    except AttributeError:
        affinity = float(os.cpu_count() or 1)
    quota = cpu_quota()
    return affinity if quota is None else min(affinity, quota)

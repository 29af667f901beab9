"""The cgroup hierarchies with a CPU controller, behind one interface: where groups go and how a quota
is written (v2 ``cpu.max``, or v1 ``cpu.cfs_period_us`` and ``cpu.cfs_quota_us``) and read back.

:func:`backends` lists the hierarchies this process sits in that carry a CPU controller;
``deploy.cgroups.detect_backend`` picks the first one where a group can really be created.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from common.ops.cpu_quota import Mount, mounts
from deploy.cgroup_files import CgroupError, read_control, write_checked, write_control

MAX_SHARES_V1 = 262_144
"""The largest v1 ``cpu.shares`` (default 1024)."""
MAX_WEIGHT_V2 = 10_000
"""The largest v2 ``cpu.weight`` (default 100)."""
PARENT = "hetero-ps"
"""The directory, under the hierarchy's root, that holds every group this package creates."""


class CgroupBackend(ABC):
    """One cgroup hierarchy with a writable CPU controller: where groups go and how limits are set."""

    version: int

    def __init__(self, mount: Mount) -> None:
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


class CgroupV2Backend(CgroupBackend):
    """cgroup v2: ``cpu.max`` holds "quota period"; controllers are enabled per subtree."""

    version = 2

    def enable_cpu(self, group: Path) -> None:
        control = group / "cgroup.subtree_control"
        if "cpu" in read_control(control).split():
            return
        if "cpu" not in read_control(group / "cgroup.controllers").split():
            raise CgroupError(f"the cpu controller is not available in {group} (cgroup.controllers)")
        write_control(control, "+cpu")
        if "cpu" not in read_control(control).split():
            raise CgroupError(f"writing +cpu to {control} did not enable the cpu controller")

    def write_limit(self, group: Path, quota_us: int, period_us: int) -> None:
        write_control(group / "cpu.max", f"{quota_us} {period_us}")

    def read_limit(self, group: Path) -> tuple[int | None, int]:
        quota, period = read_control(group / "cpu.max").split()
        return (None if quota == "max" else int(quota)), int(period)

    def reserve(self, group: Path) -> None:
        write_checked(group / "cpu.weight", str(MAX_WEIGHT_V2))


class CgroupV1Backend(CgroupBackend):
    """cgroup v1: the cpu controller's ``cpu.cfs_period_us`` and ``cpu.cfs_quota_us``."""

    version = 1

    def enable_cpu(self, group: Path) -> None:
        """Nothing to do: every v1 group of the cpu hierarchy has the controller."""

    def write_limit(self, group: Path, quota_us: int, period_us: int) -> None:
        write_control(group / "cpu.cfs_period_us", str(period_us))
        write_control(group / "cpu.cfs_quota_us", str(quota_us))

    def read_limit(self, group: Path) -> tuple[int | None, int]:
        quota = int(read_control(group / "cpu.cfs_quota_us"))
        return (None if quota < 0 else quota), int(read_control(group / "cpu.cfs_period_us"))

    def reserve(self, group: Path) -> None:
        write_checked(group / "cpu.shares", str(MAX_SHARES_V1))


def backends() -> list[CgroupBackend]:
    """The cgroup hierarchies of this process that carry a CPU controller, v2 first (unprobed)."""
    v2, v1 = mounts()
    found: list[CgroupBackend] = []
    if v2 is not None:
        controllers = v2.mount_point / "cgroup.controllers"
        if controllers.exists() and "cpu" in read_control(controllers).split():
            found.append(CgroupV2Backend(v2))
    if v1 is not None and (v1.mount_point / "cpu.cfs_quota_us").exists():
        found.append(CgroupV1Backend(v1))
    return found

"""A cgroup's control files and directories: writes that raise when the kernel refuses them, reads,
and removing a group after moving its processes out.

Every control file is written with an explicit open/write/close so that a refused value raises at
the write instead of leaving a worker silently unthrottled.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

from deploy.proc_stat import read_proc_stat

RMDIR_TIMEOUT_S = 2.0
"""How long removing a group retries while the kernel still counts a process in it."""


class CgroupError(RuntimeError):
    """A cgroup operation the kernel refused or did not apply."""


def write_control(path: Path, value: str) -> None:
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


def read_control(path: Path) -> str:
    """Read a control file's value."""
    with open(path, encoding="ascii") as f:
        return f.read().strip()


def write_checked(path: Path, value: str) -> None:
    """Write a single-value control file and check that the kernel holds that value."""
    write_control(path, value)
    held = read_control(path)
    if held != value:
        raise CgroupError(f"{path} holds {held!r} after writing {value!r}")


def start_ticks(pid: int) -> int | None:
    """A live process's start time in clock ticks since boot; None if it is gone or a zombie.

    With the pid it identifies a process even after the pid is reused.
    """
    stat = read_proc_stat(pid)
    return None if stat is None or stat.state in ("Z", "X") else stat.start_ticks


def group_pids(group: Path) -> list[int]:
    """The processes in a group (empty if the group is gone)."""
    try:
        return [int(line) for line in read_control(group / "cgroup.procs").split()]
    except FileNotFoundError:
        return []


def move_out(group: Path, home: Path) -> None:
    """Move every process of ``group`` to ``home``; processes that exit meanwhile are fine."""
    for pid in group_pids(group):
        try:
            write_control(home / "cgroup.procs", str(pid))
        except CgroupError as exc:
            if start_ticks(pid) is not None:
                raise CgroupError(f"cannot move pid {pid} out of {group} to {home}: {exc}") from exc


def remove_group(group: Path, home: Path) -> None:
    """Empty and remove a group and its subgroups; a group that is already gone is fine."""
    if not group.is_dir():
        return
    for child in sorted(p for p in group.iterdir() if p.is_dir()):
        remove_group(child, home)
    deadline = time.monotonic() + RMDIR_TIMEOUT_S
    while True:
        move_out(group, home)
        try:
            os.rmdir(group)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise CgroupError(
                    f"cannot remove {group}: {exc.strerror} (processes still in it: {group_pids(group)})"
                ) from exc
            time.sleep(0.01)

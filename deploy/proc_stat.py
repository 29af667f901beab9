"""A process's fields from Linux's ``/proc/<pid>/stat`` (proc(5)), read once, by name.

The cgroup code identifies a process by its start time (a pid can be reused); the benchmarks read
another process's CPU time and find its children (a server's shard processes). Both parse the same line, which is split after the command name's
closing parenthesis (the name itself may hold spaces and parentheses).
"""

from __future__ import annotations

import os
from typing import NamedTuple


class ProcStat(NamedTuple):
    state: str  # R, S, D, Z (zombie), X (dead), ...
    cpu_s: float  # user + system CPU seconds, all threads
    start_ticks: int  # start time in clock ticks since boot
    ppid: int  # the parent's pid


def read_proc_stat(pid: int) -> ProcStat | None:
    """Process `pid`'s state, CPU time and start time; None where /proc cannot tell (the process is
    gone, or there is no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
        fields = stat[stat.rindex(")") + 2 :].split()
        return ProcStat(fields[0], (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[19]),
                        int(fields[1]))
    except (OSError, ValueError, IndexError):
        return None


def child_pids(pid: int) -> list[int]:
    """The live processes whose parent is `pid`, in pid order (empty without /proc)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    found = []
    for entry in entries:
        if entry.isdigit() and (stat := read_proc_stat(int(entry))) is not None and stat.ppid == pid and stat.state != "Z":
            found.append(int(entry))
    return sorted(found)

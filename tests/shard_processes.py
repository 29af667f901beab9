"""The shard server processes of a job, read from /proc: which are alive, and the port each listens on."""

from __future__ import annotations

import os
from pathlib import Path


def listening_port(pid: int) -> int:
    """The TCP port process `pid` listens on (its port file is gone once it listens: the kernel's tables)."""
    sockets = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            sockets.add(target[len("socket:["):-1])
    for table in ("tcp", "tcp6"):
        for row in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in sockets:  # LISTEN, one of its sockets
                return int(fields[1].rsplit(":", 1)[1], 16)
    raise AssertionError(f"process {pid} listens on no TCP port")


def shard_children(parent: int) -> list[int]:
    """ps-shard processes started by `parent` that are still alive."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"ps.shards.server" in cmdline and str(parent).encode() in cmdline:
                found.append(int(entry.name))
    return found

"""The memory a process may still take: MemAvailable, or the cgroup's limit less its usage when lower."""

from __future__ import annotations

import math
from pathlib import Path

from common.ops.available_memory import available_cpu_bytes


def test_the_lower_of_meminfo_and_the_cgroups_room(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       2048 kB\nMemAvailable:    1024 kB\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    assert available_cpu_bytes(meminfo, cgroup) == 1024 * 1024
    (cgroup / "memory.max").write_text("524288\n")
    (cgroup / "memory.current").write_text("124288\n")
    assert available_cpu_bytes(meminfo, cgroup) == 400000
    (cgroup / "memory.max").write_text("max\n")
    assert available_cpu_bytes(meminfo, cgroup) == 1024 * 1024


def test_nothing_readable_is_no_bound(tmp_path: Path) -> None:
    assert available_cpu_bytes(tmp_path / "none", tmp_path / "none") == math.inf
    assert available_cpu_bytes() > 0

"""deploy.proc_stat: a process's /proc/<pid>/stat fields."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy.proc_stat import child_pids, read_proc_stat

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")


def test_own_process_running_with_cpu_time_and_a_start() -> None:
    before = time.process_time()
    stat = read_proc_stat(os.getpid())
    assert stat is not None
    assert stat.state == "R"
    assert stat.start_ticks > 0
    assert 0 <= stat.cpu_s <= time.process_time() + 0.02  # /proc counts in clock ticks
    assert stat.cpu_s >= before - 0.02


def test_a_name_with_spaces_and_parentheses_does_not_shift_the_fields() -> None:
    rename = "open('/proc/self/comm', 'w').write('a) b (c) d'); print('named', flush=True); import time; time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", rename], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "named"
        assert Path(f"/proc/{child.pid}/comm").read_text().strip() == "a) b (c) d"
        stat = read_proc_stat(child.pid)
        own = read_proc_stat(os.getpid())
        assert stat is not None and own is not None
        assert stat.state in ("S", "R")
        assert stat.start_ticks >= own.start_ticks  # started after this process
    finally:
        child.kill()
        child.wait()


def test_a_zombie_and_a_gone_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while (stat := read_proc_stat(child.pid)) is not None and stat.state != "Z" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert stat is not None and stat.state == "Z"  # exited, not yet waited for
    child.wait()
    assert read_proc_stat(child.pid) is None
    assert read_proc_stat(2**22 + 1) is None  # above the kernel's pid limit


def test_the_parent_and_the_children_of_a_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        stat = read_proc_stat(child.pid)
        assert stat is not None and stat.ppid == os.getpid()
        assert child.pid in child_pids(os.getpid())
        assert child_pids(child.pid) == []
    finally:
        child.kill()
        child.wait()
    assert child.pid not in child_pids(os.getpid())  # waited for: gone

"""benchmarks.process_usage: CPU seconds and memory of processes from /proc, and the scale benchmark's
CPU fields computed from them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks import process_usage

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")


def test_cpu_per_round_and_per_push_from_the_server_and_its_shards() -> None:
    before, after = {10: 1.0, 11: 0.5, 12: 0.25}, {10: 3.0, 11: 1.5, 12: 0.75}  # 2 + 1 + 0.5 s in the window
    bsp = process_usage.cpu_fields("bsp", 8, 50, 10, [11, 12], before, after)
    assert bsp == {"server_cpu_s": 3.5, "shard_cpu_s": [1.0, 0.5], "server_cpu_ms_per_round": 70.0,
                   "server_cpu_ms_per_push": 8.75}  # 3.5 s / 50 rounds; / (50 x 8 pushes)
    asp = process_usage.cpu_fields("asp", 8, 500, 10, [], {10: 1.0}, {10: 2.0})
    assert asp == {"server_cpu_s": 1.0, "shard_cpu_s": [], "server_cpu_ms_per_round": None, "server_cpu_ms_per_push": 2.0}


def test_cpu_fields_are_none_where_a_process_was_not_read_at_both_ends() -> None:
    gone = process_usage.cpu_fields("bsp", 4, 10, 10, [11], {10: 1.0, 11: 1.0}, {10: 2.0})
    assert gone == {"server_cpu_s": None, "shard_cpu_s": [None], "server_cpu_ms_per_round": None,
                    "server_cpu_ms_per_push": None}
    assert process_usage.cpu_fields("bsp", 4, 0, 10, [], {10: 1.0}, {10: 2.0})["server_cpu_ms_per_round"] is None


def test_cpu_seconds_reads_live_processes_and_leaves_out_the_others() -> None:
    found = process_usage.cpu_seconds([os.getpid(), 2**22 + 1])  # the second: above the kernel's pid limit
    assert list(found) == [os.getpid()] and found[os.getpid()] >= 0


def test_memory_fields_from_proc_files(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmHWM:\t  262144 kB\nVmRSS:\t  131072 kB\n")
    assert process_usage.proc_kb_field(status, "VmHWM") == 256.0
    assert process_usage.proc_kb_field(status, "Pss") is None
    assert process_usage.proc_kb_field(tmp_path / "missing", "VmHWM") is None
    assert process_usage.peak_rss_mb(os.getpid()) is not None
    assert process_usage.mean_max([250.0, None, 260.0]) == {"mean": 255.0, "max": 260.0}
    assert process_usage.mean_max([None]) == {"mean": None, "max": None}

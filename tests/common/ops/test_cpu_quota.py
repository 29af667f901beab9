"""common.ops.cpu_quota: the cgroup mounts of this process, the tightest CPU quota along its group's
path (v1 and v2 files written here), and a real process in a real quota declaring it as its cores."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from common.ops.cpu_quota import Mount, cpu_quota, mounts
from deploy.cgroups import CpuLimiter, detect_backend

MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / {v1} rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
40 31 0:37 / {v2} rw,relatime - cgroup2 cgroup2 rw
"""


def test_the_mounts_are_where_this_process_sits_in_each_hierarchy(tmp_path: Path) -> None:
    (tmp_path / "mountinfo").write_text(MOUNTINFO.format(v1="/c1", v2="/c2"))
    (tmp_path / "cgroup").write_text("2:cpuacct:/\n1:cpu:/job/w0\n0::/k8s/pod\n")
    v2, v1 = mounts(tmp_path / "mountinfo", tmp_path / "cgroup")
    assert v1 == Mount(Path("/c1"), Path("/c1/job/w0"))
    assert v2 is not None and v2.mount_point == Path("/c2") and v2.home.name == "pod"
    assert mounts(tmp_path / "missing", tmp_path / "cgroup") == (None, None)


def test_the_tightest_quota_along_the_path_counts_in_either_hierarchy(tmp_path: Path) -> None:
    v1 = tmp_path / "v1"
    group = v1 / "job" / "w0"
    group.mkdir(parents=True)
    for directory, quota in ((v1, -1), (v1 / "job", 150_000), (group, -1)):
        (directory / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        (directory / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_quota((None, Mount(v1, group))) == pytest.approx(1.5)
    v2 = tmp_path / "v2"
    pod = v2 / "pod"
    pod.mkdir(parents=True)
    (v2 / "cpu.max").write_text("max 100000\n")
    (pod / "cpu.max").write_text("50000 100000\n")
    assert cpu_quota((Mount(v2, pod), Mount(v1, group))) == pytest.approx(0.5)
    (pod / "cpu.max").write_text("max 100000\n")
    assert cpu_quota((Mount(v2, pod), None)) is None
    (pod / "cpu.max").write_text("garbage\n")  # unreadable: no quota from it, no error
    assert cpu_quota((Mount(v2, pod), None)) is None


def test_a_worker_in_a_quota_declares_the_quota_as_its_cores() -> None:
    backend = detect_backend()
    if backend is None:
        pytest.skip("no writable cgroup CPU controller (needs root and cgroup v1 cpu or v2 cpu.max)")
    code = "from worker.probes.resources import default_cores; print(default_cores())"
    with CpuLimiter.create("w0", 0.25, 8000, run_id=f"test-{uuid.uuid4().hex[:8]}", backend=backend) as limiter:
        out = subprocess.run([sys.executable, "-c", code], preexec_fn=limiter.preexec, capture_output=True,
                             text=True, check=True, cwd=Path(__file__).resolve().parents[3])
    assert float(out.stdout) == pytest.approx(0.25)

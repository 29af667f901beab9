"""cgroup CPU quotas: real throttling ratios, live rewrites, and no leftover groups on any exit path.

The tests that need a writable cgroup CPU controller (root on Linux with cgroup v1 cpu or v2 cpu.max)
skip elsewhere; the pure parts (slowdown factors, limit validation) always run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy import cgroup_backends, cgroups
from deploy.cgroups import CgroupBackend, CgroupError, CpuLimiter, cleanup_stale, detect_backend, slowdown_factors
from deploy.profiles import quota_period_us
from tests.repo import ROOT

SPIN = """
import time
n = 0
start, cpu = time.monotonic(), time.process_time()
end = start + {seconds}
while time.monotonic() < end:
    for _ in range(1000):
        n += 1
wall = time.monotonic() - start
print(n / wall, (time.process_time() - cpu) / wall)
"""
SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_slowdown_factors_keep_the_ratios() -> None:
    assert slowdown_factors([0.1875, 0.1875, 0.125, 1.0]) == [1 / 0.1875, 1 / 0.1875, 8.0, 1.0]
    assert slowdown_factors([3, 3]) == [1.0, 1.0]
    factors = slowdown_factors([0.2, 0.8])
    assert factors[0] / factors[1] == pytest.approx(4.0)


@pytest.mark.parametrize("shares", [[], [0], [1, -1], [float("inf")], [True]])
def test_slowdown_factors_reject_bad_shares(shares: list[float]) -> None:
    with pytest.raises(ValueError):
        slowdown_factors(shares)


@pytest.mark.parametrize(
    ("name", "cores", "period", "message"),
    [
        ("w0", 0.1, 5000, "at least 10000 us"),
        ("w0", 0, 5000, "cores must be > 0"),
        ("w0", float("nan"), 5000, "finite"),
        ("w0", 1.0, 999, "period_us"),
        ("w0", 1.0, 2_000_000, "period_us"),
        ("../escape", 1.0, 5000, "invalid worker name"),
        ("", 1.0, 5000, "invalid worker name"),
    ],
)
def test_bad_limits_are_refused_before_touching_cgroups(name: str, cores: float, period: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CpuLimiter.create(name, cores, period, backend=None)


def test_v2_control_file_format(tmp_path: Path) -> None:
    """cgroup v2 keeps quota and period in one file, "max" meaning unlimited (checked on plain files)."""
    v2 = cgroup_backends.CgroupV2Backend(cgroup_backends.Mount(tmp_path, tmp_path))
    (tmp_path / "cpu.max").touch()
    v2.write_limit(tmp_path, 1500, 8000)
    assert (tmp_path / "cpu.max").read_text() == "1500 8000"
    assert v2.read_limit(tmp_path) == (1500, 8000)
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert v2.read_limit(tmp_path) == (None, 100000)
    assert v2.parent == tmp_path / "hetero-ps"


@pytest.fixture(scope="module")
def backend() -> CgroupBackend:
    found = detect_backend()
    if found is None:
        pytest.skip(
            "no writable cgroup CPU controller (needs root and cgroup v1 cpu or v2 cpu.max); "
            f"hierarchies with a cpu controller here: {cgroups.backends() or 'none'}"
        )
    return found


@pytest.fixture
def run_id() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def limiters(backend: CgroupBackend, run_id: str) -> Iterator[list[CpuLimiter]]:
    """Limiters a test creates; closed afterwards whatever happened."""
    made: list[CpuLimiter] = []
    yield made
    for limiter in made:
        limiter.close()


def spawn(limiter: CpuLimiter, argv: list[str], **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen(argv, preexec_fn=limiter.preexec, text=True, **kwargs)  # type: ignore[call-overload]


def test_quotas_cap_cpu_time_in_proportion(
    backend: CgroupBackend, run_id: str, limiters: list[CpuLimiter]
) -> None:
    """Two spinning processes under quotas of 0.2 and 0.8 cores get CPU time in that proportion, each at
    most its cap. CPU time is what a quota controls: the work done per CPU-second also moves with CPU
    steal and cache effects on a shared VM (throughput ratios from 1:2.3 to 1:6.5 were seen here while
    the CPU shares stayed at 0.20 and 0.80), so throughput is printed, not asserted."""
    shares = [0.2, 0.8]
    period = quota_period_us(shares)
    limiters += [
        CpuLimiter.create(f"w{k}", s, period, run_id=run_id, backend=backend, reserve=True)
        for k, s in enumerate(shares)
    ]
    ratios, used, rates = [], [], []
    for _ in range(5):  # retried for a burst of load; no retry can fake a 1:4 ratio or exceed a cap
        spin = [sys.executable, "-I", "-c", SPIN.format(seconds=1.5)]
        children = [spawn(limiter, spin, stdout=subprocess.PIPE) for limiter in limiters]
        (slow, slow_cpu), (fast, fast_cpu) = (map(float, child.communicate(timeout=30)[0].split()) for child in children)
        used.append((round(slow_cpu, 3), round(fast_cpu, 3)))
        rates.append(round(fast / slow, 2))
        assert slow_cpu <= 0.2 * 1.15 and fast_cpu <= 0.8 * 1.15, f"a quota was exceeded: CPU shares {used[-1]}"
        ratios.append(fast_cpu / slow_cpu)
        if abs(ratios[-1] / 4 - 1) <= 0.25:
            break
    print(f"CPU time under shares 0.2:0.8 = 1:{ratios[-1]:.2f} (tries: {used}; throughput 1:{rates})")
    assert abs(ratios[-1] / 4 - 1) <= 0.25, f"1:4 expected within 25%, CPU shares {used}"


def test_create_writes_and_reads_back_the_limit(
    backend: CgroupBackend, run_id: str, limiters: list[CpuLimiter]
) -> None:
    limiter = CpuLimiter.create("w0", 0.125, 8000, run_id=run_id, backend=backend)
    limiters.append(limiter)
    assert limiter.limit() == (1000, 8000)
    assert limiter.path.parent.parent == backend.parent
    assert limiter.path.parent.name.startswith(f"{run_id}.{os.getpid()}.")
    with pytest.raises(CgroupError, match="already exists"):
        CpuLimiter.create("w0", 0.5, 8000, run_id=run_id, backend=backend)


def test_reserve_raises_the_weight_of_the_group_and_its_parents(
    backend: CgroupBackend, run_id: str, limiters: list[CpuLimiter]
) -> None:
    limiter = CpuLimiter.create("w0", 0.5, 2000, run_id=run_id, backend=backend, reserve=True)
    limiters.append(limiter)
    plain = CpuLimiter.create("w1", 0.5, 2000, run_id=run_id, backend=backend)
    limiters.append(plain)
    name, top = ("cpu.shares", cgroup_backends.MAX_SHARES_V1) if backend.version == 1 else ("cpu.weight", cgroup_backends.MAX_WEIGHT_V2)
    for group in (limiter.path, limiter.path.parent, backend.parent):
        assert int((group / name).read_text()) == top
    assert int((plain.path / name).read_text()) < top


def test_set_rewrites_the_quota_live(backend: CgroupBackend, run_id: str, limiters: list[CpuLimiter]) -> None:
    limiter = CpuLimiter.create("w0", 0.5, 4000, run_id=run_id, backend=backend)
    limiters.append(limiter)
    child = spawn(limiter, [sys.executable, "-c", "while True: pass"])
    try:
        limiter.set(0.25)
        assert limiter.limit() == (1000, 4000)
        if backend.version == 1:
            assert (limiter.path / "cpu.cfs_quota_us").read_text().strip() == "1000"
        else:
            assert (limiter.path / "cpu.max").read_text().split() == ["1000", "4000"]
        limiter.set(2.0, period_us=2000)
        assert limiter.limit() == (4000, 2000)
        assert (limiter.cores, limiter.period_us) == (2.0, 2000)
        with pytest.raises(ValueError, match="at least 4000 us"):
            limiter.set(0.25)
        assert limiter.limit() == (4000, 2000)
        assert limiter.pids() == [child.pid]
    finally:
        child.kill()
        child.wait()


def test_a_refused_write_raises(backend: CgroupBackend, run_id: str, limiters: list[CpuLimiter]) -> None:
    limiter = CpuLimiter.create("w0", 1.0, 10_000, run_id=run_id, backend=backend)
    limiters.append(limiter)
    with pytest.raises(CgroupError, match="refused"):
        backend.write_limit(limiter.path, 500, 10_000)  # a quota under 1 ms
    assert limiter.limit() == (10_000, 10_000)


def test_close_removes_the_group_and_is_idempotent(backend: CgroupBackend, run_id: str) -> None:
    with CpuLimiter.create("w0", 0.5, 2000, run_id=run_id, backend=backend) as limiter:
        child = spawn(limiter, SLEEP)
        assert limiter.pids() == [child.pid]
    try:
        assert not limiter.path.exists()
        assert not limiter.path.parent.exists(), "the empty run directory is removed too"
        assert cgroups.PARENT not in Path(f"/proc/{child.pid}/cgroup").read_text(), "the child was moved out"
        limiter.close()
    finally:
        child.kill()
        child.wait()


def test_add_pid(backend: CgroupBackend, run_id: str, limiters: list[CpuLimiter]) -> None:
    limiter = CpuLimiter.create("w0", 0.5, 2000, run_id=run_id, backend=backend)
    limiters.append(limiter)
    child = subprocess.Popen(SLEEP)
    try:
        limiter.add_pid(child.pid)
        assert limiter.pids() == [child.pid]
    finally:
        child.kill()
        child.wait()


def test_sigkilled_child_leaves_no_group(backend: CgroupBackend, run_id: str) -> None:
    limiter = CpuLimiter.create("w0", 0.5, 2000, run_id=run_id, backend=backend)
    child = spawn(limiter, SLEEP)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    limiter.close()
    assert not limiter.path.exists()
    assert not limiter.path.parent.exists()


OWNER = """
import subprocess, sys, time
from deploy.cgroups import CpuLimiter
limiter = CpuLimiter.create("w0", 0.5, 2000, run_id=sys.argv[1])
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], preexec_fn=limiter.preexec)
print(limiter.path, worker.pid, flush=True)
time.sleep(60)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_cleanup_stale_removes_the_groups_of_a_sigkilled_run(backend: CgroupBackend, run_id: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, run_id], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    line = owner.stdout.readline()  # type: ignore[union-attr]
    if not line:
        owner.wait()
        pytest.fail(f"the owner process failed: {owner.stderr.read()}")  # type: ignore[union-attr]
    path, worker = Path(line.split()[0]), int(line.split()[1])
    try:
        assert path.parent not in cleanup_stale(backend)
        assert path.is_dir(), "a live run's groups are left alone"
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        assert path.is_dir(), "SIGKILL leaves the group behind"
        assert path.parent in cleanup_stale(backend)
        assert not path.parent.exists()
        assert alive(worker), "the orphaned worker still runs, now outside the group"
        assert cgroups.PARENT not in Path(f"/proc/{worker}/cgroup").read_text()
    finally:
        owner.kill()
        owner.wait()
        os.kill(worker, signal.SIGKILL)


def test_detect_backend_leaves_nothing_behind(backend: CgroupBackend) -> None:
    before = sorted(p.name for p in backend.parent.iterdir() if p.is_dir())
    assert detect_backend() is not None
    assert sorted(p.name for p in backend.parent.iterdir() if p.is_dir()) == before


def test_preexec_refusal_fails_the_spawn(backend: CgroupBackend, run_id: str) -> None:
    limiter = CpuLimiter.create("w0", 0.5, 2000, run_id=run_id, backend=backend)
    limiter.close()
    with pytest.raises(subprocess.SubprocessError):
        spawn(limiter, SLEEP)

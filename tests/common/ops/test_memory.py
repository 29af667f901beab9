"""common.ops.memory: glibc malloc settings applied with mallopt (tune_malloc) and a heap reserve for blocks
over the mmap threshold (reserve_heap); no-ops elsewhere, never an error."""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

from common.ops import memory


def _glibc() -> bool:
    try:
        return sys.platform.startswith("linux") and hasattr(ctypes.CDLL(None), "gnu_get_libc_version")
    except OSError:
        return False


def test_returns_a_bool_and_can_run_twice() -> None:
    first = memory.tune_malloc()
    assert isinstance(first, bool) and memory.tune_malloc() is first


@pytest.mark.skipif(not _glibc(), reason="mallopt tuning is glibc-only")
def test_applies_on_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    for _, _, env in memory.SETTINGS:
        monkeypatch.delenv(env, raising=False)
    assert memory.tune_malloc() is True


@pytest.mark.skipif(not _glibc(), reason="mallopt tuning is glibc-only")
def test_leaves_settings_the_environment_made(monkeypatch: pytest.MonkeyPatch) -> None:
    for _, _, env in memory.SETTINGS:
        monkeypatch.setenv(env, "1048576")
    assert memory.tune_malloc() is False


def test_no_op_off_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory.sys, "platform", "darwin")
    assert memory.tune_malloc() is False


def test_never_raises_when_libc_cannot_be_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("no libc here")

    monkeypatch.setattr(memory.sys, "platform", "linux")
    monkeypatch.setattr(memory.ctypes, "CDLL", broken)
    assert memory.tune_malloc() is False


# Steps that each allocate two 48 MiB tensors (over glibc's 32 MiB mmap threshold) and some small ones,
# write them and free them all ("step", as a training step's activations), or that keep a small tensor
# allocated after each big one ("keep", the worst case for reuse: the freed block's slot is then a
# little short of what the next aligned allocation asks for). Prints whether the reserve was made, and
# over the 10 steps after the warm-up ones the page faults per step and how much the resident set grew
# (MiB). glibc's placement drifts through the free heap for a while (small freed chunks held in its
# caches keep a freed block's slot from merging again) and then settles: about 20 steps here.
BIG_BLOCKS = """
import resource, sys, torch
from common.ops.memory import reserve_heap, tune_malloc

def rss_mib():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS")) / 1024

pattern, warmup, steps = sys.argv[2], int(sys.argv[3]), 10
tune_malloc()
reserved = reserve_heap(int(sys.argv[1]) << 20)
kept = []
for i in range(warmup + steps):
    if i == warmup:
        faults, rss = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, rss_mib()
    if pattern == "step":
        blocks = [torch.empty(48 << 18).fill_(1.0), torch.ones(1000), torch.empty(48 << 18).fill_(2.0), torch.ones(9)]
        del blocks
    else:
        block = torch.empty(48 << 18).fill_(1.0)
        kept.append(torch.ones(4096))
        del block
print(reserved, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / steps, rss_mib() - rss)
"""


def _big_blocks(reserve_mib: int, pattern: str, warmup: int) -> tuple[bool, float, float]:
    out = subprocess.run([sys.executable, "-c", BIG_BLOCKS, str(reserve_mib), pattern, str(warmup)], capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()
    return out[0] == "True", float(out[1]), float(out[2])


@pytest.mark.skipif(not _glibc(), reason="the heap reserve is glibc-only")
def test_reserve_lets_big_blocks_reuse_memory() -> None:
    reserved, faults, growth = _big_blocks(512, "step", warmup=20)
    assert reserved
    assert faults < 1000, f"{faults:.0f} page faults per step with the reserve"  # 2 x 12,288 pages fresh
    assert growth < 16, f"the resident set grew {growth:.0f} MiB over the steps"
    unreserved, faults_without, _ = _big_blocks(0, "step", warmup=20)
    assert not unreserved
    assert faults_without > 20_000, "without the reserve each block is freshly mapped (the test's premise)"


@pytest.mark.skipif(not _glibc(), reason="the heap reserve is glibc-only")
def test_reserve_bounds_the_heap_in_the_worst_case() -> None:
    """Blocks that cannot reuse their slot use up the reserve and then go back to mmap: the resident
    set grows by at most the reserve (ten 48 MiB blocks would be 480 MiB without the bound)."""
    reserved, _, growth = _big_blocks(128, "keep", warmup=1)
    assert reserved
    assert growth < 128 + 48 + 16, f"the resident set grew {growth:.0f} MiB with a 128 MiB reserve"


def test_reserve_is_a_no_op_for_nothing_or_when_the_environment_sets_mmap(monkeypatch: pytest.MonkeyPatch) -> None:
    assert memory.reserve_heap(0) is False
    monkeypatch.setenv("MALLOC_MMAP_MAX_", "0")
    assert memory.reserve_heap(1 << 20) is False


def test_reserve_never_raises_when_libc_cannot_be_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("no libc here")

    monkeypatch.setattr(memory.sys, "platform", "linux")
    monkeypatch.setattr(memory.ctypes, "CDLL", broken)
    assert memory.reserve_heap(1 << 20) is False

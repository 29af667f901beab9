"""glibc malloc tuning for processes that move large buffers (`tune_malloc`).

Every step allocates and frees buffers of a few MiB (1 MiB chunks, decoded gradients, reply
payloads). With glibc's defaults a freed block above the (dynamic) mmap threshold goes back to the
kernel, and so does free memory at the top of the heap above the trim threshold; the next step's
buffer then lands on fresh pages and pays a page fault per 4 KiB on its first write. On the VM this
was measured on, a 100 MB copy into fresh memory took 55 ms against 9 ms into reused memory.
`tune_malloc` keeps such memory in the process instead: blocks under 32 MiB come from the heap
(M_MMAP_THRESHOLD, which also stops glibc from moving the threshold) and up to 1 GiB of free heap is
kept (M_TRIM_THRESHOLD). The cost is a process that holds on to memory it freed, up to those bounds.

Blocks of 32 MiB and more still get fresh pages every time, because glibc will not raise the mmap
threshold past 32 MiB: a worker's activations at a large CPU batch (45 MB per convolution output
for the CNN at batch 340) were mapped and unmapped every step, 10,000-20,000 page faults and 8% more
CPU per sample in the HL8 benchmark. `reserve_heap` grows the heap once so that such blocks are cut
from free heap memory, which glibc always tries before mapping a new block; it stays in the process
(under the trim threshold) and is reused every step. mmap stays on for blocks the free heap cannot
hold, so the heap never grows past the reserve for them (turning mmap off for good, M_MMAP_MAX=0,
grew the heap by a block per step: posix_memalign's slack kept a freed block from fitting again).
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
MMAP_MAX_DEFAULT = 65536  # glibc's default for M_MMAP_MAX
# glibc's placement drifts through ~300 MiB before settling (tests/common/ops/test_memory.py)
DEFAULT_HEAP_RESERVE_MIB = 512
HEAP_RESERVE_ENV = "PS_WORKER_HEAP_RESERVE_MIB"  # for workers that ps-cluster and the benchmarks start
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's upper bound for M_MMAP_THRESHOLD on 64-bit
TRIM_THRESHOLD_BYTES = 1 << 30
# (mallopt parameter, value, the environment variable glibc reads for the same setting at start)
SETTINGS = ((M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES, "MALLOC_MMAP_THRESHOLD_"),
            (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES, "MALLOC_TRIM_THRESHOLD_"))


def _glibc() -> ctypes.CDLL | None:
    """The process's C library when it is glibc on Linux, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None  # not glibc (musl and others tune differently)
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    libc.mallopt.restype = ctypes.c_int
    return libc


def tune_malloc() -> bool:
    """Apply the settings above with mallopt(3) on glibc; returns whether it did. Never raises.

    A no-op (False) off Linux/glibc. A setting whose glibc environment variable is set
    (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``) is left as the environment chose;
    False then means the environment decided everything.
    """
    try:
        libc = _glibc()
        if libc is None:
            return False
        applied = False
        for param, value, env in SETTINGS:
            if env not in os.environ:
                applied = libc.mallopt(param, value) == 1 or applied
        return applied
    except (OSError, AttributeError, TypeError, ValueError):
        return False


def reserve_heap(nbytes: int) -> bool:
    """Grow the heap by `nbytes` once (allocate with mmap off, free, mmap back on); returns whether
    it did. Never raises. Pages are only backed once used, so the reserve costs memory in proportion
    to the largest set of big blocks the process holds at once, not `nbytes`.

    Call it after `tune_malloc` (whose trim threshold keeps the freed reserve in the heap). A no-op
    (False) off glibc, for `nbytes` <= 0, when ``MALLOC_MMAP_MAX_`` is set (mmap's limit is then the
    environment's and cannot be restored), or when the memory cannot be had.
    """
    if nbytes <= 0 or "MALLOC_MMAP_MAX_" in os.environ:
        return False
    try:
        libc = _glibc()
        if libc is None:
            return False
        libc.malloc.argtypes = (ctypes.c_size_t,)
        libc.malloc.restype = ctypes.c_void_p
        libc.free.argtypes = (ctypes.c_void_p,)
        libc.free.restype = None
        if libc.mallopt(M_MMAP_MAX, 0) != 1:
            return False
        try:
            block = libc.malloc(nbytes)
            libc.free(block)
        finally:
            libc.mallopt(M_MMAP_MAX, MMAP_MAX_DEFAULT)
        return bool(block)
    except (OSError, AttributeError, TypeError, ValueError):
        return False


def heap_reserve_mib(flag: int | None = None) -> int:
    """The heap reserve in MiB: `flag` (ps-worker --heap-reserve), else $PS_WORKER_HEAP_RESERVE_MIB,
    else the default. ValueError for a value below 0 or a variable that is not an integer."""
    if flag is not None:
        value, source = flag, "--heap-reserve"
    else:
        source, text = f"${HEAP_RESERVE_ENV}", os.environ.get(HEAP_RESERVE_ENV, str(DEFAULT_HEAP_RESERVE_MIB))
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{source} must be an integer number of MiB, got {text!r}") from None
    if value < 0:
        raise ValueError(f"{source} must be >= 0, got {value}")
    return value


def tune_for_training(reserve_mib: int) -> None:
    """What a training process (ps-worker, and the baselines it is compared with) applies at start:
    `tune_malloc`, then a heap reserve of `reserve_mib` MiB."""
    tune_malloc()
    reserve_heap(reserve_mib << 20)

"""``python -m benchmarks.guard PARENT_PID PROGRAM ARGS...``: exec PROGRAM so that it dies with its parent.

The benchmarks start every child through this launcher: it asks the kernel for SIGKILL when the parent
dies (``prctl(PR_SET_PDEATHSIG)``, kept across exec), exits if the parent is already gone, then replaces
itself with PROGRAM (same pid). So no server or client outlives a benchmark, however that ends, and the
benchmark needs no ``preexec_fn`` (unsafe in a process with threads, as gRPC and torch start them).
Linux only; elsewhere PROGRAM just runs.
"""

from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit():
        print("usage: python -m benchmarks.guard PARENT_PID PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    parent = int(argv[0])
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before prctl took effect
            return 1
    os.execvp(argv[1], argv[1:])
    return 127  # not reached: execvp raises on failure


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

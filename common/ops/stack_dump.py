"""`kill -USR1 <pid>` makes a ps-server or ps-worker print every thread's Python stack to stderr.

For a process that seems stuck (a worker that does not exit, a server that does not answer): the
dump says where each thread waits, without stopping the process. Tests send it before they kill a
process that did not exit, so the failure shows its stacks.
"""

from __future__ import annotations

import faulthandler
import signal
import sys


def enable_stack_dump() -> None:
    """Print all threads' stacks to stderr on SIGUSR1 (where the platform has it, and where stderr is a
    real file: not when main() runs inside a test that captures it)."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)

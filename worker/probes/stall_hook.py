"""A test hook, for fault-injection benchmarks only (benchmarks/chaos.py): a worker whose training loop
stalls while its process, and its heartbeat thread, live on (a loader stuck on a network file system,
a hung kernel). With $PS_WORKER_STALL_DIR set, the loop waits before each step for as long as a file
named after the worker exists in that folder. Unset (the normal case), it costs one lookup per step."""

from __future__ import annotations

import os
import time
from pathlib import Path

STALL_DIR_ENV = "PS_WORKER_STALL_DIR"
POLL_S = 0.05


def stall_while_asked(name: str) -> None:
    """Wait while $PS_WORKER_STALL_DIR/<name> exists (no wait when the variable is unset)."""
    folder = os.environ.get(STALL_DIR_ENV)
    if not folder:
        return
    flag = Path(folder) / name
    while flag.exists():
        time.sleep(POLL_S)

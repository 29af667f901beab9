"""A background thread that tells the server this worker is alive, also while it computes."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

from worker.transport.client import ServerError


def _checked_interval(interval: float) -> float:
    """`interval` if it is a usable wait (> 0 s and finite): 0 would spin, inf or NaN never beat."""
    if not (interval > 0 and math.isfinite(interval)):
        raise ValueError(f"heartbeat interval must be > 0 s and finite, got {interval}")
    return interval


class Heartbeat:
    """Calls `beat(worker_id)` every `interval` seconds until stopped; errors are left to the main loop."""

    def __init__(self, beat: Callable[[str], object], worker_id: str, interval: float) -> None:
        self._beat = beat
        self.worker_id = worker_id
        self.interval = _checked_interval(interval)
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by retarget() and stop(): end the current wait early
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._wake.wait(self.interval):  # retargeted (or stopped): wait again, on the new interval
                self._wake.clear()
                continue
            try:
                self._beat(self.worker_id)
            except ServerError:
                continue

    def retarget(self, worker_id: str, interval: float) -> None:
        """Beat for `worker_id` every `interval` seconds from now on (after a rejoin: a restarted
        server may give a new id and, from another --evict-after, another interval). A wait on the
        old interval is cut short, so a shorter new one cannot let the server evict this worker."""
        interval = _checked_interval(interval)
        self.worker_id, self.interval = worker_id, interval
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)

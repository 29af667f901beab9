"""A background thread that tells the server this worker is alive, also while it computes."""

from __future__ import annotations

import threading
from collections.abc import Callable

from worker.client import ServerError


class Heartbeat:
    """Calls `beat(worker_id)` every `interval` seconds until stopped; errors are left to the main loop."""

    def __init__(self, beat: Callable[[str], object], worker_id: str, interval: float) -> None:
        self._beat = beat
        self.worker_id = worker_id
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._beat(self.worker_id)
            except ServerError:
                continue

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

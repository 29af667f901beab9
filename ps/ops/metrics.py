"""The metrics log: one JSON object per line, appended and flushed per event.

Observers (`observe`) see every event as it is written, and the samples (`sample`) that are too
frequent for the file (one per step, one per push): the Prometheus exporter and the health service
are fed this way, so the cores report once, to this log.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Observer = Callable[[dict[str, Any]], None]


class MetricsLog:
    """Appends events to a JSON-lines file (none when no path is given) and echoes them for people."""

    def __init__(self, path: str | Path | None, echo: Callable[[dict[str, Any]], None] | None = None) -> None:
        self._echo = echo
        self._file = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115
        self._lock = threading.RLock()  # an echo or observer may write a record of its own
        self._start = time.monotonic()
        self._observers: list[Observer] = []

    def observe(self, observer: Observer) -> None:
        """Hand `observer` every later event and sample, as a dict with its kind under "event".

        It is called on the writer's thread (the server's event loop; an evaluation's thread for
        `eval`), so it must be quick and must not raise."""
        self._observers.append(observer)

    def sample(self, kind: str, **fields: Any) -> None:
        """A measurement for the observers only, never the file: per step or per push, too frequent
        to log. Costs nothing without observers."""
        if self._observers:
            record = {"event": kind, **fields}
            for observer in self._observers:
                observer(record)

    def write(self, event: str, **fields: Any) -> dict[str, Any]:
        """One record, stamped, appended, echoed and observed whole before another (the event loop's and the
        evaluator's thread write both): the file's order is the times' and the echoed lines'."""
        with self._lock:
            record = {"event": event, "time": round(time.time(), 3), "elapsed_s": round(time.monotonic() - self._start, 3)}
            record.update(fields)
            if self._file is not None:
                self._file.write(json.dumps(record, sort_keys=False) + "\n")
                self._file.flush()
            if self._echo is not None:
                self._echo(record)
            for observer in self._observers:
                observer(record)
        return record

    def close(self) -> None:
        if self._file is not None:
            with self._lock:
                self._file.close()
                self._file = None


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Parse a metrics log; a torn last line (a crash mid-write) is skipped."""
    events = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events

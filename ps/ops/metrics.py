"""The metrics log: one JSON object per line, appended and flushed per event."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class MetricsLog:
    """Appends events to a JSON-lines file (none when no path is given) and echoes them for people."""

    def __init__(self, path: str | Path | None, echo: Callable[[dict[str, Any]], None] | None = None) -> None:
        self._echo = echo
        self._file = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115
        self._lock = threading.Lock()
        self._start = time.monotonic()

    def write(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"event": event, "time": round(time.time(), 3), "elapsed_s": round(time.monotonic() - self._start, 3)}
        record.update(fields)
        if self._file is not None:
            line = json.dumps(record, sort_keys=False)
            with self._lock:
                self._file.write(line + "\n")
                self._file.flush()
        if self._echo is not None:
            self._echo(record)
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

"""What is read back from the files a cluster's processes write: a log's last line for an error
message, a metrics-log line's event, and the events appended to a metrics log since the last read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def last_line(path: Path) -> str:
    """The last non-empty line of a log file ('' if none)."""
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [line for line in lines if line]
    return lines[-1] if lines else ""


def event_of(line: bytes) -> str | None:
    """The ``event`` of one metrics-log line (None for a torn or foreign line)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record.get("event") if isinstance(record, dict) else None


class MetricsTail:
    """Reads the events appended to a JSON-lines file since the last call (complete lines only)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._pending = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        events = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                events.append(record)
        return events

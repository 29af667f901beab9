"""What the launcher reads back from the files its processes write: a log's last line for an error
message, and a metrics-log line's event."""

from __future__ import annotations

import json
from pathlib import Path


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

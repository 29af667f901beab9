"""The worker runtime: `connect()` joins a parameter server and returns a Session.

Both are loaded on first use: the command-line front doors and the tools that import a light part of
this package (its probes, its flags) answer `--help` and bad arguments without loading torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from worker.connection import connect
    from worker.runtime import Session

__all__ = ["Session", "connect"]


def __getattr__(name: str) -> Any:
    if name == "connect":
        from worker.connection import connect
        return connect
    if name == "Session":
        from worker.runtime import Session
        return Session
    raise AttributeError(f"module 'worker' has no attribute {name!r}")

"""The worker runtime: `connect()` joins a parameter server and returns a Session."""

from worker.runtime import Session, connect

__all__ = ["Session", "connect"]

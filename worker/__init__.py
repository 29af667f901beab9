"""The worker runtime: `connect()` joins a parameter server and returns a Session."""

from worker.connection import connect
from worker.runtime import Session

__all__ = ["Session", "connect"]

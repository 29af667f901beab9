"""Per-worker secrets: a worker proves on every call that it is the worker that joined.

Pure: no I/O. A worker id is no secret (`Status` lists them all), so Join also hands each worker a
secret, HMAC-SHA256 of its id under a random key of the job. The server recomputes it instead of
storing it, and so can a shard server that the coordinator gave the key when it loaded it: shards
verify pushes and pulls without knowing who is in the job. A rejoin is a new worker id, so a new
secret; a restarted server draws a new key, so old secrets stop working with the old ids.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from common.errors import PermissionDenied, Unauthenticated

KEY_BYTES = 32


class WorkerKeys:
    """The job's key and the secrets derived from it; compares in constant time."""

    def __init__(self, key: bytes | None = None) -> None:
        if key is not None and len(key) < KEY_BYTES:
            raise ValueError(f"a worker key has at least {KEY_BYTES} bytes, got {len(key)}")
        self.key = secrets.token_bytes(KEY_BYTES) if key is None else bytes(key)

    def secret(self, worker_id: str) -> str:
        """The secret of `worker_id` (64 hex digits)."""
        return hmac.new(self.key, worker_id.encode(), hashlib.sha256).hexdigest()

    def check(self, worker_id: str, presented: str) -> None:
        """Unauthenticated when no secret is presented, PermissionDenied when it is not this worker's."""
        if not presented:
            raise Unauthenticated(f"a call as worker {worker_id!r} must carry the secret its Join returned")
        if not hmac.compare_digest(presented.encode(errors="replace"), self.secret(worker_id).encode()):
            raise PermissionDenied(f"wrong secret for worker {worker_id!r}: only the worker that joined may act as it")

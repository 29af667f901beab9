"""The coordinator's own credential for a shard server's control calls (Load, Commit, Fetch).

Workers hold the job's token and their secrets, which let them push and pull a shard's range; only
the coordinator may load a shard (its range, round and the key the workers' secrets derive from),
commit its rounds or fetch its values and optimizer state. It proves that with this key, sent as call
metadata, which no worker ever sees: `ps-server --shards N` makes a fresh one for the shards it starts
and hands it to them in their environment; shards started by hand (`--shard-addresses`) and their
coordinator read the same one from $PS_SHARD_KEY or the file $PS_SHARD_KEY_FILE names, never from a
command line, where `ps` would show it.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Mapping
from typing import Any

from ps.serving.handlers import SERVICES
from common.transport.security import MetadataCheck, secret_from_environment

SHARD_KEY_ENV = "PS_SHARD_KEY"
SHARD_KEY_FILE_ENV = "PS_SHARD_KEY_FILE"
METADATA_KEY = "x-ps-shard-key"
MIN_KEY_CHARS = 16
CONTROL_METHODS = tuple(f"/{SERVICES['ParameterShard'].full_name}/{name}" for name in ("Load", "Commit", "Fetch"))


def new_shard_key() -> str:
    return secrets.token_hex(32)


def resolve_shard_key(env: Mapping[str, str] = os.environ) -> str | None:
    """The key from $PS_SHARD_KEY, else from the file $PS_SHARD_KEY_FILE names; None when neither is
    set; ValueError (one line) for one that is unreadable, short, or not printable ASCII."""
    key, source = secret_from_environment(env, SHARD_KEY_ENV, SHARD_KEY_FILE_ENV, "shard key")
    if key is None:
        return None
    if len(key) < MIN_KEY_CHARS or not all("!" <= c <= "~" for c in key):
        raise ValueError(f"{source}: the shard key must be at least {MIN_KEY_CHARS} printable ASCII characters "
                         "without spaces")
    return key


def key_metadata(key: str) -> tuple[str, str]:
    """The metadata pair the coordinator sends with every control call."""
    return (METADATA_KEY, key)


class ControlKeyInterceptor(MetadataCheck):
    """Refuses Load, Commit and Fetch with UNAUTHENTICATED unless they carry the coordinator's key
    (compared in constant time); the servicer is never called and the request never read."""

    def __init__(self, key: str) -> None:
        self._expected = key.encode()

    def checks(self, method: str) -> bool:
        return method in CONTROL_METHODS

    def _problem(self, metadata: Any) -> str | None:
        values = [v for k, v in (metadata or ()) if k == METADATA_KEY]
        if len(values) != 1:
            return "shard control (Load, Commit, Fetch) is for the coordinator: its key is missing"
        value = values[0] if isinstance(values[0], bytes) else str(values[0]).encode(errors="replace")
        return None if hmac.compare_digest(value, self._expected) else "shard control: not the coordinator's key"

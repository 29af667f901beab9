"""What every server process of the service shares: gRPC message limits and the event loop."""

from __future__ import annotations

import asyncio
from typing import Any

# Payload travels as ~1 MiB chunks; the limit leaves room for headers and rejects anything bigger.
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]


def run_loop(coro: Any) -> Any:
    """Run a coroutine on uvloop when it is installed, else asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)

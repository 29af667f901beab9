"""What every server process of the service shares: gRPC message limits and the event loop."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
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


def on_stop_signal(callback: Callable[[], None]) -> None:
    """Call `callback` on the running loop when SIGTERM or SIGINT arrives."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, callback)


async def wait_for_stop_signal() -> None:
    """Return once SIGTERM or SIGINT arrives."""
    stop = asyncio.Event()
    on_stop_signal(stop.set)
    await stop.wait()

"""What every server process of the service shares: gRPC message limits, the flags of where it
listens and of the calls it holds at once, and the event loop."""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.ops.arg_types import host_name, port_number, positive_int

# Payload travels as ~1 MiB chunks; the limit leaves room for headers and rejects anything bigger.
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]


def add_listen_flags(parser: argparse.ArgumentParser | Any, default_port: int) -> None:
    """--host, --port and --port-file on `parser` (or an argument group)."""
    parser.add_argument("--host", type=host_name, default="127.0.0.1",
                        help="address to listen on (0.0.0.0 for all; an IPv6 address with or without brackets)")
    parser.add_argument("--port", type=port_number, default=default_port, help="0 picks a free port (printed at start)")
    parser.add_argument("--port-file", type=Path, default=None, help="write the bound port to this file (for scripts)")


def add_call_flags(parser: argparse.ArgumentParser | Any, default: int | None, control: str, unset: str = "") -> None:
    """--max-concurrent-rpcs and --max-rpcs-per-peer (ps/serving/call_budget.py's CallBounds.serving)
    on `parser` (or an argument group); `control`: the control calls named in the help, `unset`: what
    the default is when it is None."""
    parser.add_argument("--max-concurrent-rpcs", type=positive_int, default=default, metavar="N",
                        help=f"data-plane calls (Push, Pull) served at once, and as many control calls ({control}), the "
                             f"others refused (RESOURCE_EXHAUSTED); health and reflection have small bounds of their own{unset}")
    parser.add_argument("--max-rpcs-per-peer", type=positive_int, default=None, metavar="N",
                        help="of those, the most one address may hold (workers on one host or behind one NAT share it); "
                             "unset: --max-concurrent-rpcs")


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

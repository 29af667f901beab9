"""What every server process of the service shares: gRPC message limits, the flags of where it
listens and of the calls it holds at once, and the event loop."""

from __future__ import annotations

import argparse
import asyncio
import resource
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
# Descriptors a server keeps for its own files (checkpoints, logs, data, its shards' channels and
# processes), which no number of connections may take; and the fewest connections it admits.
FILE_RESERVE = 256
MIN_CONNECTIONS = 64
MAX_GRPC_INT = 2**31 - 1


def raise_file_limit() -> int:
    """Raise this process's soft limit of open files to its hard limit (as far as the kernel lets); the
    soft limit now. Many systems start processes at 1,024: that many idle connections would be all."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return MAX_GRPC_INT if soft == resource.RLIM_INFINITY else soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):  # above the kernel's nr_open: keep the limit there is
        return soft
    return target


def connection_cap(file_limit: int) -> int:
    """The connections a server holds at once under `file_limit` open files: all but FILE_RESERVE of them
    (at least MIN_CONNECTIONS), so that connections held open by anyone who reaches the port, token
    or not, never leave the server without a descriptor for a checkpoint; gRPC closes one beyond it."""
    return min(MAX_GRPC_INT, max(MIN_CONNECTIONS, file_limit - FILE_RESERVE))


def serving_options() -> list[tuple[str, int]]:
    """A listening server's gRPC options: GRPC_OPTIONS and connection_cap() of its open-file limit,
    raised first (raise_file_limit)."""
    return [*GRPC_OPTIONS, ("grpc.max_allowed_incoming_connections", connection_cap(raise_file_limit()))]


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

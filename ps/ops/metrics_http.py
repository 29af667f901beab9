"""The HTTP server of `--metrics-port`: `GET /metrics` answered by one thread, whatever the number of
connections, and only to the token's holders when there is a token.

A thread per connection (prometheus-client's own server) lets anyone who reaches the port hold a
thread with a socket that sends nothing: 600 idle sockets held 371 threads and climbing. Here one
thread waits on every socket with a selector. A connection must send its whole request head within
`idle_timeout_s` of connecting (bytes trickled in do not extend it) and take its reply within that
time again; at most `max_connections` are open at once, and one more closes the oldest, so a flood
of idle sockets churns while a scraper's request, sent as it connects, is read. A request head is at
most MAX_REQUEST_BYTES. With a token, every request needs `Authorization: Bearer <token>` (compared
in constant time), else 401. Every reply closes its connection (`Connection: close`). The flags that
set it up are the same for ps-server and ps-shard (`add_endpoint_flags`).
"""

from __future__ import annotations

import argparse
import gzip
import hmac
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path

from common.ops.arg_types import port_number

MAX_CONNECTIONS = 64
IDLE_TIMEOUT_S = 10.0
MAX_REQUEST_BYTES = 8192
PATH = "/metrics"

Render = Callable[[str], tuple[bytes, str]]
"""The page for an `Accept` header: (body, its content type)."""


def add_endpoint_flags(group: argparse._ActionsContainer, what: str) -> None:
    """--metrics-port, --metrics-port-file, --metrics-host and --metrics-without-token; `what`: the metrics served."""
    group.add_argument("--metrics-port", type=port_number, default=None,
                       help=f"serve Prometheus metrics ({what}) over HTTP at /metrics on --metrics-host:PORT (0 picks a "
                            "free port, printed at start); unset: no endpoint")
    group.add_argument("--metrics-port-file", type=Path, default=None,
                       help="write the bound --metrics-port to this file (for scripts)")
    group.add_argument("--metrics-host", default="127.0.0.1",
                       help="address the metrics endpoint listens on: loopback unless told otherwise (0.0.0.0 for all, "
                            "e.g. for a Prometheus on another machine)")
    group.add_argument("--metrics-without-token", action="store_true",
                       help="serve /metrics to callers without the token even when the server has one (a scraper that "
                            "cannot send `Authorization: Bearer TOKEN`); by default the token is required")


@dataclass
class _Connection:
    sock: socket.socket
    opened: float
    deadline: float
    inbox: bytearray = field(default_factory=bytearray)
    outbox: memoryview | None = None


class MetricsHTTPServer:
    """Serves `render()` at GET /metrics on one thread (see the module)."""

    def __init__(self, render: Render, token: str | None = None, *, max_connections: int = MAX_CONNECTIONS,
                 idle_timeout_s: float = IDLE_TIMEOUT_S) -> None:
        if max_connections < 1 or not idle_timeout_s > 0:
            raise ValueError("max_connections must be >= 1 and idle_timeout_s > 0")
        self.render = render
        self._expected = f"Bearer {token}".encode() if token is not None else None
        self.max_connections = max_connections
        self.idle_timeout_s = idle_timeout_s
        self._selector = selectors.DefaultSelector()
        self._connections: dict[socket.socket, _Connection] = {}
        self._listener: socket.socket | None = None
        self._wake_read, self._wake_write = socket.socketpair()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    def start(self, host: str, port: int) -> int:
        """Listen on host:port (0: a free port) and serve on a daemon thread; returns the port."""
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        listener = socket.create_server((host, port), family=family, backlog=128)
        listener.setblocking(False)
        self._listener = listener
        self._selector.register(listener, selectors.EVENT_READ, "accept")
        self._wake_read.setblocking(False)
        self._selector.register(self._wake_read, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._run, name="metrics-http", daemon=True)
        self._thread.start()
        return int(listener.getsockname()[1])

    def close(self) -> None:
        """Stop serving and close every socket."""
        self._closing.set()
        try:
            self._wake_write.send(b"x")
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout=10)
        for connection in list(self._connections.values()):
            self._drop(connection)
        if self._listener is not None:
            self._selector.unregister(self._listener)
            self._listener.close()
            self._listener = None
        self._selector.close()
        self._wake_read.close()
        self._wake_write.close()

    # ------------------------------------------------------------------ the loop
    def _run(self) -> None:
        while not self._closing.is_set():
            now = time.monotonic()
            soonest = min((c.deadline for c in self._connections.values()), default=now + 1.0)
            for key, mask in self._selector.select(timeout=max(0.0, min(soonest - now, 1.0))):
                if key.data == "accept":
                    self._accept()
                elif key.data == "wake":
                    continue
                elif key.fileobj in self._connections:
                    self._serve(key.data, mask)
            now = time.monotonic()
            for connection in [c for c in self._connections.values() if c.deadline <= now]:
                self._drop(connection)

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of file descriptors, a connection reset before accept: the next try may succeed
                return
            sock.setblocking(False)
            if len(self._connections) >= self.max_connections:
                self._drop(min(self._connections.values(), key=lambda c: c.opened))
            now = time.monotonic()
            connection = _Connection(sock, now, now + self.idle_timeout_s)
            self._connections[sock] = connection
            self._selector.register(sock, selectors.EVENT_READ, connection)

    def _serve(self, connection: _Connection, mask: int) -> None:
        try:
            if mask & selectors.EVENT_READ and connection.outbox is None:
                self._read(connection)
            if mask & selectors.EVENT_WRITE and connection.outbox is not None:
                self._write(connection)
        except OSError:  # the peer reset or went away
            self._drop(connection)

    def _read(self, connection: _Connection) -> None:
        data = connection.sock.recv(4096)
        if not data:
            self._drop(connection)
            return
        connection.inbox += data
        end = connection.inbox.find(b"\r\n\r\n")
        if end < 0:
            if len(connection.inbox) > MAX_REQUEST_BYTES:
                self._reply(connection, HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE)
            return
        if end > MAX_REQUEST_BYTES:
            self._reply(connection, HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE)
            return
        self._answer(connection, bytes(connection.inbox[:end]))

    def _answer(self, connection: _Connection, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            self._reply(connection, HTTPStatus.BAD_REQUEST)
            return
        method, target = parts[0], parts[1]
        headers = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if colon:
                headers[name.strip().lower()] = value.strip()
        if method not in ("GET", "HEAD"):
            self._reply(connection, HTTPStatus.METHOD_NOT_ALLOWED, extra={"Allow": "GET, HEAD"})
        elif self._expected is not None and not hmac.compare_digest(
                headers.get("authorization", "").encode("latin-1"), self._expected):
            self._reply(connection, HTTPStatus.UNAUTHORIZED, extra={"WWW-Authenticate": 'Bearer realm="metrics"'})
        elif target.split("?", 1)[0] != PATH:
            self._reply(connection, HTTPStatus.NOT_FOUND)
        else:
            try:
                body, content_type = self.render(headers.get("accept", ""))
            except Exception:  # noqa: BLE001 (a collector that fails must not stop the endpoint)
                self._reply(connection, HTTPStatus.INTERNAL_SERVER_ERROR)
                return
            extra = {}
            if "gzip" in headers.get("accept-encoding", ""):
                body, extra = gzip.compress(body), {"Content-Encoding": "gzip"}
            self._reply(connection, HTTPStatus.OK, body, content_type, extra, head_only=method == "HEAD")

    def _reply(self, connection: _Connection, status: HTTPStatus, body: bytes | None = None,
               content_type: str = "text/plain; charset=utf-8", extra: dict[str, str] | None = None,
               head_only: bool = False) -> None:
        if body is None:
            body = f"{status.value} {status.phrase}\n".encode()
        head = [f"HTTP/1.1 {status.value} {status.phrase}", f"Content-Type: {content_type}",
                f"Content-Length: {len(body)}", "Connection: close",
                *(f"{k}: {v}" for k, v in (extra or {}).items())]
        connection.outbox = memoryview(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (b"" if head_only else body))
        connection.deadline = time.monotonic() + self.idle_timeout_s
        self._selector.modify(connection.sock, selectors.EVENT_WRITE, connection)
        self._write(connection)

    def _write(self, connection: _Connection) -> None:
        assert connection.outbox is not None
        try:
            sent = connection.sock.send(connection.outbox)
        except (BlockingIOError, InterruptedError):
            return
        connection.outbox = connection.outbox[sent:]
        if not connection.outbox:
            self._drop(connection)

    def _drop(self, connection: _Connection) -> None:
        if self._connections.pop(connection.sock, None) is None:
            return
        try:
            self._selector.unregister(connection.sock)
        except (KeyError, ValueError):
            pass
        connection.sock.close()

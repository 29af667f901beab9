"""The /metrics HTTP server in-process: it answers GET /metrics and nothing else, asks for the token
when it has one, closes a connection that has not sent its request in time (trickled bytes do not
extend it), keeps at most its cap of connections open, and serves on one thread however many sockets
are open (a real ps-server under 600 idle sockets: tests/ps/ops/test_prometheus.py)."""

from __future__ import annotations

import gzip
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from ps.ops.metrics_http import MAX_REQUEST_BYTES, MetricsHTTPServer

PAGE = b"# TYPE hetero_ps_steps_total counter\nhetero_ps_steps_total 7.0\n"
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy


def render(accept: str) -> tuple[bytes, str]:
    return PAGE, "text/plain; version=0.0.4; charset=utf-8"


@pytest.fixture
def serve() -> Iterator:
    started: list[MetricsHTTPServer] = []

    def start(token: str | None = None, **limits: float) -> tuple[MetricsHTTPServer, int]:
        server = MetricsHTTPServer(render, token, **limits)  # type: ignore[arg-type]
        started.append(server)
        return server, server.start("127.0.0.1", 0)

    yield start
    for server in started:
        server.close()


def get(port: int, path: str = "/metrics", headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with OPENER.open(request, timeout=10) as reply:
            return reply.status, reply.read(), dict(reply.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read(), dict(err.headers)


def raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        return b"".join(iter(lambda: sock.recv(65536), b""))


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closed `sock` within `seconds` (reads nothing but the end)."""
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_get_metrics_answers_the_page_and_other_requests_are_refused(serve) -> None:
    _, port = serve()
    status, body, headers = get(port)
    assert status == 200 and body == PAGE and headers["Connection"] == "close"
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    status, body, headers = get(port, headers={"Accept-Encoding": "gzip"})
    assert status == 200 and headers["Content-Encoding"] == "gzip" and gzip.decompress(body) == PAGE
    assert get(port, "/metrics?name[]=x")[0] == 200
    assert get(port, "/")[0] == 404 and get(port, "/metricsx")[0] == 404
    assert raw(port, b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 405 ")
    assert raw(port, b"HEAD /metrics HTTP/1.1\r\n\r\n").endswith(b"\r\n\r\n")
    assert raw(port, b"nonsense\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert raw(port, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * MAX_REQUEST_BYTES + b"\r\n\r\n").startswith(b"HTTP/1.1 431 ")


def test_with_a_token_only_its_holders_read_the_page(serve) -> None:
    _, port = serve(token="s3cret")
    status, body, headers = get(port)
    assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer") and PAGE not in body
    assert get(port, headers={"Authorization": "Bearer wrong"})[0] == 401
    assert get(port, headers={"Authorization": "s3cret"})[0] == 401
    assert get(port, headers={"Authorization": "Bearer s3cret"})[:2] == (200, PAGE)


def test_a_connection_that_sends_no_request_in_time_is_closed_trickling_or_not(serve) -> None:
    server, port = serve(idle_timeout_s=0.5)
    idle = socket.create_connection(("127.0.0.1", port))
    trickle = socket.create_connection(("127.0.0.1", port))
    start = time.monotonic()
    for byte in b"GET /metrics HTTP/1.1\r\n":  # one byte every 0.05 s: never the whole head in time
        if time.monotonic() - start > 2:
            break
        try:
            trickle.send(bytes([byte]))
        except OSError:
            break
        time.sleep(0.05)
    assert closed_within(idle, 5) and closed_within(trickle, 5)
    assert time.monotonic() - start < 5
    idle.close()
    trickle.close()
    deadline = time.monotonic() + 5
    while server.open_connections and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.open_connections == 0 and get(port)[0] == 200


def test_idle_sockets_beyond_the_cap_close_the_oldest_and_one_thread_serves_them_all(serve) -> None:
    threads = threading.active_count()
    server, port = serve(max_connections=8)
    sockets = [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]
    try:
        deadline = time.monotonic() + 10
        while server.open_connections < 8 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert get(port)[:2] == (200, PAGE)  # a scraper's request, sent as it connects, is read
        assert server.open_connections <= 8 and threading.active_count() == threads + 1
        assert closed_within(sockets[0], 5)  # the oldest went to make room
    finally:
        for sock in sockets:
            sock.close()


def test_a_failing_page_is_a_500_and_the_server_goes_on() -> None:
    calls = []

    def flaky(accept: str) -> tuple[bytes, str]:
        calls.append(accept)
        if len(calls) == 1:
            raise RuntimeError("a collector failed")
        return render(accept)

    server = MetricsHTTPServer(flaky)
    port = server.start("127.0.0.1", 0)
    try:
        assert get(port)[0] == 500 and get(port)[:2] == (200, PAGE)
    finally:
        server.close()

"""Connections held open by anyone who reaches a real ps-server's port (no token needed: a call's token
is checked after its connection is made): however many there are, the server keeps descriptors of its
own, and the job beside them checkpoints every epoch and trains to its end."""

from __future__ import annotations

import resource
import shutil
import socket
import time
from pathlib import Path

import pytest

from ps.serving.server_options import FILE_RESERVE
from tests.processes import start_server

TOKEN = "hostile-connections-token"
FILE_LIMIT = 1024  # a common default soft limit, where a server's descriptors run out first
FLOOD = FILE_LIMIT + 100
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"  # an HTTP/2 client's first bytes: the connection is gRPC's to hold
JOB = ["--quiet", "--workers", "1", "--model-arg", "hidden=16", "--dataset", "digits", "--global-batch", "64",
       "--epochs", "40", "--lr", "0.1", "--token", TOKEN]
FINISH_S = 120.0


def open_connections(port: int, count: int) -> list[socket.socket]:
    """`count` connections to `port` that send the HTTP/2 preface and then nothing (fewer where the
    server refuses a connection outright)."""
    held = []
    for _ in range(count):
        try:
            connection = socket.create_connection(("127.0.0.1", port), timeout=5)
            connection.sendall(PREFACE)
        except OSError:
            continue
        held.append(connection)
    return held


def closed_by_the_server(connections: list[socket.socket]) -> int:
    """How many of `connections` the server has closed (read to their end)."""
    closed = 0
    for connection in connections:
        connection.settimeout(0.0)
        try:
            while data := connection.recv(65536):
                del data
            closed += 1
        except (BlockingIOError, ConnectionResetError) as err:
            closed += isinstance(err, ConnectionResetError)
    return closed


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")
def test_connections_held_open_leave_the_server_descriptors_for_its_checkpoints(tmp_path: Path) -> None:
    """A server whose open files are limited to 1,024 (soft and hard) and a stranger without the token
    who holds 1,124 connections open once the job trains: gRPC closes those beyond the server's cap
    (its limit less FILE_RESERVE), the worker's own connection stays, every epoch's checkpoint is
    written and the job ends. Without the cap the connections took every descriptor: each checkpoint
    after them failed with EMFILE ('checkpoint ... not written')."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < FLOOD + 64:
        pytest.skip(f"this process may open {hard} files, fewer than the {FLOOD} connections")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    checkpoints = tmp_path / "ckpts"
    cluster = start_server(tmp_path, [*JOB, "--checkpoint-dir", str(checkpoints), "--keep-checkpoints", "50"],
                           prefix=["prlimit", f"--nofile={FILE_LIMIT}:{FILE_LIMIT}"])
    held: list[socket.socket] = []
    try:
        worker = cluster.start_worker("w0", "--token", TOKEN)
        deadline = time.monotonic() + FINISH_S
        while not any(checkpoints.glob("ckpt-*.pt")):
            assert time.monotonic() < deadline and cluster.server.poll() is None, cluster.server_log()
            time.sleep(0.05)
        held = open_connections(cluster.port, FLOOD)
        assert cluster.wait(FINISH_S) == 0, cluster.server_log()
        assert worker.wait(15) == 0, cluster.worker_log("w0")
        log = cluster.server_log()
        assert "not written" not in log, log
        assert len(list(checkpoints.glob("ckpt-*.pt"))) == 40, sorted(p.name for p in checkpoints.iterdir())
        assert closed_by_the_server(held) >= FLOOD - (FILE_LIMIT - FILE_RESERVE), "the server held every connection"
    finally:
        for connection in held:
            connection.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        cluster.stop()

"""The fast path's rendezvous store listens only on the address it is asked for (a real ps-server
--allreduce on one loopback address is not reachable through another), and a member that claims a
round beyond its server's is not believed when a group adopts a copy of the model."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.processes import ENV
from worker.collective import most_advanced

JOB = ["--mode", "bsp", "--allreduce", "on", "--workers", "2", "--model-arg", "hidden=8", "--dataset", "digits",
       "--global-batch", "16", "--epochs", "1", "--quiet"]


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def reachable(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError:
        return False
    return True


@pytest.mark.parametrize(("asked", "other"), [("127.0.0.2", "127.0.0.1"), ("127.0.0.1", "127.0.0.2")])
def test_the_store_listens_only_where_it_was_asked(tmp_path: Path, asked: str, other: str) -> None:
    port = free_port(asked)
    port_file = tmp_path / "port"
    server = subprocess.Popen([sys.executable, "-m", "ps.server", "--host", asked, "--port", "0", "--port-file",
                               str(port_file), "--rendezvous-port", str(port), *JOB],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    try:
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):  # the store starts before the server listens
            assert server.poll() is None and time.monotonic() < deadline, server.communicate()[0]
            time.sleep(0.05)
        assert reachable(asked, port)
        assert not reachable(other, port)
    finally:
        server.terminate()
        server.communicate(timeout=30)


def test_a_copy_claiming_a_round_beyond_the_servers_is_not_adopted() -> None:
    assert most_advanced([7.0, 8.0, 7.0], cap=8) == (1, 8)  # a copy that applied the open round wins
    assert most_advanced([7.0, 1e9, 7.0], cap=8) == (0, 7)  # a claim past the server's round does not
    assert most_advanced([-1.0, 1e9], cap=0) == (0, -1)
    assert most_advanced([3.0, 3.0, 2.0], cap=9) == (0, 3)  # the lowest rank among equals

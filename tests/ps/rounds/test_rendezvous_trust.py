"""Only the job's members reach the fast path's store (a real `ps-server --allreduce --token`): it is
served by the ParameterServer's own Rendezvous RPC, so a caller without the token, a member with
another's secret or of another generation, one that left, and an oversize key or value are refused
and change nothing, and the server listens on no port but its gRPC one. A member that claims a round beyond
its server's is not believed when a group adopts a copy of the model."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from common.transport.messages import StoreCall
from protos import ps_pb2, ps_pb2_grpc
from tests.processes import Cluster, start_server
from worker.transport.client import Joined, PSClient, ServerError
from worker.paths.collective import most_advanced

TOKEN = "store-token_for.tests"
JOB = ["--mode", "bsp", "--allreduce", "on", "--workers", "2", "--model-arg", "hidden=8", "--dataset", "digits",
       "--global-batch", "16", "--epochs", "1", "--evict-after", "600", "--round-deadline", "off", "--token", TOKEN]
TIMEOUT = 60.0
LISTEN = "0A"  # the TCP state LISTEN in /proc/net/tcp


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on (its sockets' inodes, found in /proc/net/tcp and tcp6)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN and fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, list[tuple[PSClient, Joined]]]]:
    """The server and its two joined workers (each with its own client), in rank order."""
    cluster = start_server(tmp_path_factory.mktemp("store"), JOB)
    clients = [PSClient(cluster.target, token=TOKEN) for _ in range(2)]
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(c.join, f"w{i}", 1.0, TIMEOUT) for i, c in enumerate(clients)]
            pairs = [(c, f.result(TIMEOUT)) for c, f in zip(clients, futures)]
        yield cluster, sorted(pairs, key=lambda pair: pair[1].group.rank)
    finally:
        for client in clients:
            client.close()
        cluster.stop()


def request(joined: Joined, op: int, *keys: str, **fields: object) -> ps_pb2.StoreRequest:
    base: dict[str, object] = {"worker_id": joined.worker_id, "secret": joined.secret, "generation": joined.group.generation}
    return ps_pb2.StoreRequest(**{**base, **fields}, op=op, keys=keys)


def store_call(joined: Joined, op: str, *keys: str, generation: int | None = None, value: bytes = b"") -> StoreCall:
    return StoreCall(joined.group.generation if generation is None else generation, op, keys, value)


def refused(stub: ps_pb2_grpc.ParameterServerStub, message: ps_pb2.StoreRequest, code: grpc.StatusCode,
            needle: str, metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {TOKEN}"),)) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.Rendezvous(message, timeout=TIMEOUT, metadata=metadata)
    assert info.value.code() == code and needle in (info.value.details() or ""), info.value


def test_only_a_rank_of_the_generation_reaches_the_store_and_a_refusal_changes_nothing(job) -> None:
    cluster, ((first, a), (second, b)) = job
    assert (a.group.generation, a.group.rank, b.group.rank) == (1, 0, 1)
    first.rendezvous(a.worker_id, store_call(a, "set", "k", value=b"mine"))
    with grpc.insecure_channel(cluster.target) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        put = request(a, ps_pb2.STORE_SET, "k", value=b"evil")
        refused(stub, put, grpc.StatusCode.UNAUTHENTICATED, "no token", metadata=())
        refused(stub, request(a, ps_pb2.STORE_GET, "k"), grpc.StatusCode.UNAUTHENTICATED, "no token", metadata=())
        refused(stub, request(a, ps_pb2.STORE_SET, "k", value=b"evil", secret=b.secret), grpc.StatusCode.PERMISSION_DENIED,
                f"wrong secret for worker {a.worker_id!r}")
        refused(stub, request(a, ps_pb2.STORE_SET, "k", value=b"evil", secret=""), grpc.StatusCode.UNAUTHENTICATED,
                "must carry the secret its Join returned")
        refused(stub, request(a, ps_pb2.STORE_SET, "k", value=b"evil", worker_id="w-unknown"), grpc.StatusCode.NOT_FOUND,
                "unknown worker id 'w-unknown'")
        refused(stub, request(a, ps_pb2.STORE_SET, "k", value=b"evil", generation=2), grpc.StatusCode.FAILED_PRECONDITION,
                "group generation 2 is not the current one (1)")
        refused(stub, request(a, ps_pb2.STORE_SET, "k", value=b"e" * (64 * 1024 + 1)), grpc.StatusCode.INVALID_ARGUMENT,
                "a store value has at most 65536 bytes")
        refused(stub, request(a, ps_pb2.STORE_SET, "k" * 513, value=b"evil"), grpc.StatusCode.INVALID_ARGUMENT,
                "a store key has 1 to 512 characters, got 513")
        refused(stub, request(a, 0, "k"), grpc.StatusCode.INVALID_ARGUMENT, "unknown store op 'unknown (0)'")
    assert first.rendezvous(a.worker_id, store_call(a, "get", "k")).value == b"mine"
    assert first.rendezvous(a.worker_id, store_call(a, "num_keys")).number == 1
    # a member that left holds its secret still, but no rank: and the others' generation 1 is gone
    secret = b.secret
    second.leave(b.worker_id)
    second.use_secret(b.worker_id, secret)
    with pytest.raises(ServerError, match=re.escape(f"NOT_FOUND: worker {b.worker_id!r} left; Join again")):
        second.rendezvous(b.worker_id, store_call(b, "get", "k"))
    with pytest.raises(ServerError, match=r"FAILED_PRECONDITION: group generation 1 is not the current one \(2\)"):
        first.rendezvous(a.worker_id, store_call(a, "get", "k"))
    assert first.rendezvous(a.worker_id, store_call(a, "num_keys", generation=2)).number == 0  # a new, empty store


def test_the_server_listens_on_its_grpc_port_alone(job) -> None:
    cluster, _ = job
    assert listening_ports(cluster.server.pid) == {cluster.port}


def test_a_copy_claiming_a_round_beyond_the_servers_is_not_adopted() -> None:
    assert most_advanced([7.0, 8.0, 7.0], cap=8) == (1, 8)  # a copy that applied the open round wins
    assert most_advanced([7.0, 1e9, 7.0], cap=8) == (0, 7)  # a claim past the server's round does not
    assert most_advanced([-1.0, 1e9], cap=0) == (0, -1)
    assert most_advanced([3.0, 3.0, 2.0], cap=9) == (0, 3)  # the lowest rank among equals

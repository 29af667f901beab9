"""Hostile load beside a real job (ps-server, ps-shard and ps-worker processes), from a caller written
from the protocols alone (benchmarks/hostile/load.py): health Watch streams opened without the token and
Push streams that never send a chunk do not stop a worker training, at a ps-server or at a ps-shard;
a member of a fast-path group cannot rewrite another's keys in the group's store, nor keep it from
setting its own by filling the store."""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.transport.security import bearer
from protos import ps_pb2, ps_pb2_grpc
from benchmarks.hostile.load import Load, own_address, silent_pushes, watches
from tests.processes import ENV, Cluster, start_server

TOKEN = "hostile-load-token"
JOB = ["--quiet", "--workers", "1", "--model-arg", "hidden=16", "--dataset", "digits", "--global-batch", "64",
       "--epochs", "1", "--lr", "0.1"]
FINISH_S = 90.0
RPC_S = 10.0
SERVING = health_pb2.HealthCheckResponse.SERVING


def wait_for(predicate: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def trains_beside(cluster: Cluster, load: Load, *worker_args: str) -> None:
    """A worker started while `load` runs trains the whole job: the server and the worker exit 0."""
    wait_for(lambda: load.total() > 0 or load.streaming >= min(load.count, 4), "the hostile calls to start")
    worker = cluster.start_worker("w0", *worker_args)
    try:
        assert cluster.wait(FINISH_S) == 0, cluster.server_log()
    finally:
        load.stop()
    assert worker.wait(15) == 0, cluster.worker_log("w0")
    (summary,) = cluster.events("summary")
    assert summary["epochs"] == 1


def test_watch_streams_without_the_token_leave_a_worker_training(tmp_path: Path) -> None:
    """90 Watch streams without the token on loopback: four are served (a Watch's bound per address),
    the others RESOURCE_EXHAUSTED; Check answers beside them; beyond loopback a Watch without the token
    is UNAUTHENTICATED; the token holder's worker trains the job to its end."""
    cluster = start_server(tmp_path, [*JOB, "--token", TOKEN, "--host", "0.0.0.0"])
    load = watches(cluster.target, 90)
    try:
        wait_for(lambda: load.answers["RESOURCE_EXHAUSTED"] >= 80, "the Watches beyond the bound to be refused")
        assert load.streaming == 4
        with grpc.insecure_channel(cluster.target) as channel:
            assert health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=RPC_S).status == SERVING
        address = own_address()
        if address is not None:
            with grpc.insecure_channel(f"{address}:{cluster.port}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                with pytest.raises(grpc.RpcError) as beyond:
                    next(stub.Watch(health_pb2.HealthCheckRequest(), timeout=RPC_S))
                assert beyond.value.code() == grpc.StatusCode.UNAUTHENTICATED, beyond.value
                assert "served on loopback only" in (beyond.value.details() or "")
        trains_beside(cluster, load, "--token", TOKEN)
        assert load.streaming <= 4
    finally:
        load.stop()
        cluster.stop()


def test_push_streams_that_never_send_a_chunk_leave_a_worker_training(tmp_path: Path) -> None:
    """Without a token, on loopback: 100 Push streams that send nothing, each opened again as soon as
    it ends, take the data plane's places; the worker's calls, which speak at once, displace them
    (RESOURCE_EXHAUSTED) and the job trains to its end."""
    cluster = start_server(tmp_path, JOB)
    load = silent_pushes(cluster.target, 100)
    try:
        trains_beside(cluster, load)
        assert load.answers["RESOURCE_EXHAUSTED"] > 0, load.answers
    finally:
        load.stop()
        cluster.stop()


@pytest.fixture
def shard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A ps-shard started by hand (64 calls of a kind at once), its coordinator's key in ENV; its address."""
    monkeypatch.setitem(ENV, "PS_SHARD_KEY", "a-coordinator-key-for-hostile-tests")
    port_file = tmp_path / "shard.port"
    process = subprocess.Popen([sys.executable, "-m", "ps.shards.server", "--port", "0", "--port-file", str(port_file),
                                "--max-concurrent-rpcs", "64"], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: port_file.exists() and port_file.read_text().strip() != "" or process.poll() is not None, "the shard")
        assert process.poll() is None
        yield f"127.0.0.1:{int(port_file.read_text())}"
    finally:
        process.kill()
        process.wait()


def test_watch_streams_at_a_shard_leave_its_coordinator_and_the_worker_going(tmp_path: Path, shard: str) -> None:
    """90 Watch streams held at a ps-shard: four are served; its coordinator loads it and the worker
    pushes and pulls its range to the job's end."""
    load = watches(shard, 90)
    cluster = None
    try:
        wait_for(lambda: load.answers["RESOURCE_EXHAUSTED"] >= 80, "the Watches beyond the bound to be refused")
        assert load.streaming == 4
        cluster = start_server(tmp_path, [*JOB, "--shard-addresses", shard])
        trains_beside(cluster, load)
    finally:
        load.stop()
        if cluster is not None:
            cluster.stop()


# ------------------------------------------------------------------------------------ the group's store
def store(stub: ps_pb2_grpc.ParameterServerStub, joined: ps_pb2.JoinReply, op: int, *keys: str,
          **fields: object) -> ps_pb2.StoreReply:
    request = ps_pb2.StoreRequest(worker_id=joined.worker_id, secret=joined.secret, generation=joined.generation,
                                  op=op, keys=keys, **fields)
    return stub.Rendezvous(request, metadata=(bearer(TOKEN),), timeout=RPC_S)


def refused(call: object, code: grpc.StatusCode, needle: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call()  # type: ignore[operator]
    assert info.value.code() == code and needle in (info.value.details() or ""), info.value


def test_a_member_cannot_rewrite_anothers_keys_or_crowd_it_out_of_the_store(tmp_path: Path) -> None:
    """Two members of an --allreduce job's group: rank 1 cannot set, compare_set or delete rank 0's
    address key (PERMISSION_DENIED, the value stays); rank 0 filling its share of the keys is refused
    (FAILED_PRECONDITION) and rank 1 still sets its own."""
    cluster = start_server(tmp_path, ["--mode", "bsp", "--allreduce", "on", "--workers", "2", "--model-arg", "hidden=8",
                                      "--global-batch", "16", "--epochs", "1", "--evict-after", "600",
                                      "--round-deadline", "off", "--token", TOKEN])
    try:
        with grpc.insecure_channel(cluster.target) as channel:
            stub = ps_pb2_grpc.ParameterServerStub(channel)
            with concurrent.futures.ThreadPoolExecutor(2) as pool:  # the job starts once both joined
                futures = [pool.submit(stub.Join, ps_pb2.JoinRequest(name=f"w{i}", cores=1.0), metadata=(bearer(TOKEN),),
                                       timeout=60) for i in range(2)]
                first, second = sorted((f.result() for f in futures), key=lambda j: j.rank)
            assert (first.rank, second.rank, first.generation) == (0, 1, second.generation)
            store(stub, first, ps_pb2.STORE_SET, "addr/0", value=b"10.0.0.1:5000")
            for op, fields in ((ps_pb2.STORE_SET, {"value": b"10.6.6.6:6666"}),
                               (ps_pb2.STORE_COMPARE_SET, {"expected": b"10.0.0.1:5000", "value": b"10.6.6.6:6666"}),
                               (ps_pb2.STORE_DELETE, {})):
                refused(lambda: store(stub, second, op, "addr/0", **fields), grpc.StatusCode.PERMISSION_DENIED,
                        "store key 'addr/0' belongs to rank 0, which set it first: rank 1 may read it or wait on it")
            assert store(stub, second, ps_pb2.STORE_GET, "addr/0").value == b"10.0.0.1:5000"

            share = 0
            while True:  # rank 0 sets keys until its share is full
                try:
                    store(stub, first, ps_pb2.STORE_SET, f"fill/{share}", value=b"x")
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION, exc
                    assert "rank 0 owns" in (exc.details() or "") and "the most one member may" in (exc.details() or "")
                    break
                share += 1
                assert share <= 4096, "rank 0 was never stopped"
            store(stub, second, ps_pb2.STORE_SET, "addr/1", value=b"10.0.0.2:5000")
            assert store(stub, first, ps_pb2.STORE_GET, "addr/1").value == b"10.0.0.2:5000"
    finally:
        cluster.stop()

"""Shard servers trust only their coordinator for Load, Commit and Fetch (its own key, which workers
never see), serve TLS like their coordinator, and bound what a Load may carry. Real processes."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch

from protos import ps_pb2, ps_pb2_grpc
from common.transport.messages import PushMeta, PushTimes
from ps.serving import blob
from tests import processes
from tests.processes import ENV, start_server
from tests.tls_certs import Certs, certs  # noqa: F401 (a fixture)
from tests.shard_processes import listening_port, shard_children
from worker.transport.client import PSClient

KEY = "the-coordinators-own-key-0123456789"
TOKEN = "the-jobs-token-every-worker-holds"
JOB = ["--mode", "bsp", "--workers", "1", "--model-arg", "hidden=16", "--dataset", "digits", "--global-batch", "32",
       "--controller", "static", "--epochs", "50", "--grace", "1", "--quiet", "--shards", "2"]


def refused(call: Callable[[], Any], code: grpc.StatusCode, text: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        result = call()
        if isinstance(result, Iterator):
            list(result)
    assert info.value.code() == code and text in (info.value.details() or ""), info.value


def shard_state(stub: ps_pb2_grpc.ParameterShardStub, worker_id: str, secret: str) -> tuple[int, bytes]:
    """The round and values a worker pulls from the shard."""
    reply = list(stub.Pull(ps_pb2.PullRequest(worker_id=worker_id, secret=secret), metadata=[("authorization", f"Bearer {TOKEN}")],
                           timeout=10))
    return reply[0].header.round, b"".join(chunk.data for chunk in reply)


def test_shard_control_without_the_coordinators_key_is_refused_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patch:
        patch.setitem(processes.ENV, "PS_SHARD_KEY", KEY)
        cluster = start_server(tmp_path, [*JOB, "--token", TOKEN])
    client = PSClient(cluster.target, token=TOKEN)
    try:
        (pid,) = shard_children(cluster.server.pid)
        joined = client.join("solo", 1.0, timeout=60)
        worker, secret = joined.worker_id, client.secret(joined.worker_id)
        with grpc.insecure_channel(f"127.0.0.1:{listening_port(pid)}") as channel:
            stub = ps_pb2_grpc.ParameterShardStub(channel)
            before = shard_state(stub, worker, secret)
            token = ("authorization", f"Bearer {TOKEN}")
            hostile = {"spec": "{}", "start": 0, "stop": 1, "round": 10**9, "max_workers": 1, "worker_key": "00" * 32,
                       "params": torch.zeros(1), "optimizer": None}
            calls = {
                "Load": lambda md: stub.Load(iter([ps_pb2.BlobChunk(seq=k, data=d) for k, d in enumerate(blob.pack(hostile))]),
                                            metadata=md, timeout=10),
                "Commit": lambda md: stub.Commit(ps_pb2.CommitRequest(round=before[0], lr=0.1), metadata=md, timeout=10),
                "Fetch": lambda md: stub.Fetch(ps_pb2.FetchRequest(), metadata=md, timeout=10),
            }
            for name, call in calls.items():  # a worker's credentials (the token) are not the coordinator's
                refused(lambda call=call: call([token]), grpc.StatusCode.UNAUTHENTICATED, "its key is missing")
                refused(lambda call=call: call([token, ("x-ps-shard-key", KEY[:-1] + "x")]),
                        grpc.StatusCode.UNAUTHENTICATED, "not the coordinator's key")
            assert shard_state(stub, worker, secret) == before
            fetched = blob.unpack([c.data for c in calls["Fetch"]([token, ("x-ps-shard-key", KEY)])])  # the key works
            assert fetched["round"] == before[0]
        # and the job goes on: a push steps the shard's range
        params = torch.empty(joined.layout.numel)
        plan = client.pull(worker, params)
        old = params.clone()
        client.push(PushMeta(worker, plan.round, 0, plan.batch_size, PushTimes(1.0), "float32"),
                    torch.ones(joined.layout.numel), params)
        assert not torch.equal(params[-10:], old[-10:])
    finally:
        client.close()
        cluster.stop()


def start_shard(tmp_path: Path, *flags: str, env: dict[str, str]) -> tuple[subprocess.Popen[str], int]:
    port_file = tmp_path / "shard.port"
    proc = subprocess.Popen([sys.executable, "-m", "ps.shards.server", "--port", "0", "--port-file", str(port_file), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 60
    while not (port_file.exists() and port_file.read_text().strip()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    return proc, int(port_file.read_text())


def test_a_shard_needs_a_key_and_bounds_a_load(tmp_path: Path) -> None:
    plain = {k: v for k, v in ENV.items() if not k.startswith("PS_SHARD_KEY")}
    done = subprocess.run([sys.executable, "-m", "ps.shards.server", "--port", "0"], capture_output=True, text=True,
                          env=plain, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("ps-shard: error: no coordinator key: set $PS_SHARD_KEY")
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    proc, port = start_shard(tmp_path, "--max-load-mib", "1", env={**plain, "PS_SHARD_KEY_FILE": str(key_file)})
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = ps_pb2_grpc.ParameterShardStub(channel)
            chunks = (ps_pb2.BlobChunk(seq=k, data=b"\0" * (256 << 10)) for k in range(5))  # 1.25 MiB
            refused(lambda: stub.Load(chunks, metadata=[("x-ps-shard-key", KEY)], timeout=10),
                    grpc.StatusCode.RESOURCE_EXHAUSTED, "more than 1 MiB")
            refused(lambda: stub.Load(iter([ps_pb2.BlobChunk(seq=0, data=b"x")]), metadata=[("x-ps-shard-key", KEY)], timeout=10),
                    grpc.StatusCode.INVALID_ARGUMENT, "bad shard load")  # under the bound: read, and refused as data
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_shards_speak_tls_like_their_coordinator(tmp_path: Path, certs: Certs) -> None:  # noqa: F811
    tls = ["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)]
    refusal = subprocess.run([sys.executable, "-m", "ps.server", "--port", "0", *JOB, *tls], capture_output=True,
                             text=True, env=ENV, timeout=60)
    assert refusal.returncode == 2 and "--shards with TLS needs --shard-tls-ca" in refusal.stderr
    cluster = start_server(tmp_path, [*JOB, *tls, "--shard-tls-ca", str(certs.ca), "--token", TOKEN])
    client = PSClient(cluster.target, token=TOKEN, tls_ca=certs.ca)
    try:
        (pid,) = shard_children(cluster.server.pid)
        with grpc.insecure_channel(f"127.0.0.1:{listening_port(pid)}") as channel:  # plaintext cannot even connect
            refused(lambda: ps_pb2_grpc.ParameterShardStub(channel).Pull(ps_pb2.PullRequest(), timeout=5),
                    grpc.StatusCode.UNAVAILABLE, "")
        joined = client.join("solo", 1.0, timeout=60)
        assert joined.shards
        params = torch.empty(joined.layout.numel)
        plan = client.pull(joined.worker_id, params)
        old = params.clone()
        client.push(PushMeta(joined.worker_id, plan.round, 0, plan.batch_size, PushTimes(1.0), "float32"),
                    torch.ones(joined.layout.numel), params)
        assert not torch.equal(params[-10:], old[-10:])  # the shard's range, over TLS, was stepped
    finally:
        client.close()
        cluster.stop()

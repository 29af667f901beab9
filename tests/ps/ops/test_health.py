"""gRPC health checking and reflection of real `ps-server` and `ps-shard` processes, seen by grpc's
own health and reflection clients: the statuses a probe gets as a job runs, drains and stops."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from protos import ps_pb2, ps_pb2_grpc
from common.transport.security import bearer
from tests.processes import ENV, start_server
from worker.probes.stall_hook import STALL_DIR_ENV
from tests.metrics_scrape import scrape, value

SERVER = "hetero_ps.ParameterServer"
SHARD = "hetero_ps.ParameterShard"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
TOKEN = "health-test-token"
JOB = ["--quiet", "--workers", "1", "--model-arg", "hidden=16", "--global-batch", "64"]
TIMEOUT = 10.0


def check(channel: grpc.Channel, service: str) -> int:
    """The status a probe gets (no token, as Kubernetes' and grpc_health_probe's carry none)."""
    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT).status


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class Watcher:
    """A Watch of one service on a thread of its own: every status the server streams, in order."""

    def __init__(self, channel: grpc.Channel, service: str) -> None:
        self.seen: list[int] = []
        self._call = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=service))
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for reply in self._call:
                self.seen.append(reply.status)
        except grpc.RpcError:  # the server stopped (or the test cancelled)
            pass

    def until(self, status: int) -> None:
        wait_for(lambda: bool(self.seen) and self.seen[-1] == status, f"Watch to stream {health_pb2.HealthCheckResponse.ServingStatus.Name(status)} (seen {self.seen})")

    def ended(self, timeout: float = 30.0) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def cancel(self) -> None:
        self._call.cancel()


def reflect(channel: grpc.Channel, request: reflection_pb2.ServerReflectionRequest,
            metadata: tuple[tuple[str, str], ...] = ()) -> reflection_pb2.ServerReflectionResponse:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    (reply,) = list(stub.ServerReflectionInfo(iter([request]), metadata=metadata, timeout=TIMEOUT))
    return reply


def listed_services(channel: grpc.Channel, metadata: tuple[tuple[str, str], ...] = ()) -> set[str]:
    reply = reflect(channel, reflection_pb2.ServerReflectionRequest(list_services=""), metadata)
    return {s.name for s in reply.list_services_response.service}


def described_methods(channel: grpc.Channel, service: str, metadata: tuple[tuple[str, str], ...] = ()) -> set[str]:
    """The methods of `service` in the file descriptor that reflection sends for it (what grpcurl reads)."""
    reply = reflect(channel, reflection_pb2.ServerReflectionRequest(file_containing_symbol=service), metadata)
    methods = set()
    for raw in reply.file_descriptor_response.file_descriptor_proto:
        proto = descriptor_pb2.FileDescriptorProto.FromString(raw)
        for s in proto.service:
            if f"{proto.package}.{s.name}" == service:
                methods |= {m.name for m in s.method}
    return methods


@pytest.fixture
def channels() -> Iterator[Callable[[str], grpc.Channel]]:
    opened: list[grpc.Channel] = []

    def open_channel(target: str) -> grpc.Channel:
        opened.append(grpc.insecure_channel(target))
        return opened[-1]

    yield open_channel
    for channel in opened:
        channel.close()


def stalled(stub: ps_pb2_grpc.ParameterServerStub, token: tuple) -> bool:
    """No round closed for a second: the only worker is held (BSP waits for its push)."""
    before = stub.Status(ps_pb2.StatusRequest(), metadata=token, timeout=TIMEOUT).round
    time.sleep(1.0)
    return stub.Status(ps_pb2.StatusRequest(), metadata=token, timeout=TIMEOUT).round == before


def test_server_health_without_token_reflection_with_it_and_not_serving_while_it_drains(
    tmp_path: Path, channels, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ps-server with --token: probes need no token, reflection and the service do. SERVING once it
    listens; on SIGTERM NOT_SERVING at once, while it waits --grace for a (stopped) worker to hear of
    the end, and after."""
    stall = tmp_path / "stall"
    stall.mkdir()
    monkeypatch.setitem(ENV, STALL_DIR_ENV, str(stall))
    cluster = start_server(tmp_path, [*JOB, "--epochs", "50", "--token", TOKEN, "--grace", "30"])
    watcher = None
    try:
        channel = channels(cluster.target)
        assert check(channel, "") == SERVING
        assert check(channel, SERVER) == SERVING
        with pytest.raises(grpc.RpcError) as unknown:
            check(channel, "no.such.Service")
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        watcher = Watcher(channel, SERVER)
        watcher.until(SERVING)

        with pytest.raises(grpc.RpcError) as refused:
            listed_services(channel)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        token = (bearer(TOKEN),)
        assert {SERVER, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= listed_services(channel, token)
        assert {"Join", "Push", "Pull", "Leave", "Heartbeat", "Status"} <= described_methods(channel, SERVER, token)
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        with pytest.raises(grpc.RpcError) as guarded:
            stub.Status(ps_pb2.StatusRequest(), timeout=TIMEOUT)
        assert guarded.value.code() == grpc.StatusCode.UNAUTHENTICATED

        worker = cluster.start_worker("w0", "--token", TOKEN)
        wait_for(lambda: stub.Status(ps_pb2.StatusRequest(), metadata=token, timeout=TIMEOUT).round >= 2, "two rounds")
        # held before its next push (no push of its may be in flight to carry the end), then stopped
        # (nor a heartbeat): it cannot hear of the end, and the server drains for --grace
        (stall / "w0").touch()
        wait_for(lambda: stalled(stub, token), "the worker to hold")
        worker.send_signal(signal.SIGSTOP)
        (stall / "w0").unlink()
        cluster.server.send_signal(signal.SIGTERM)
        watcher.until(NOT_SERVING)
        assert check(channel, "") == NOT_SERVING and check(channel, SERVER) == NOT_SERVING
        assert cluster.server.poll() is None  # still draining, and saying so
        worker.send_signal(signal.SIGCONT)
        assert cluster.wait(60) == 0, cluster.server_log()
        assert watcher.ended()
        assert watcher.seen == [SERVING, NOT_SERVING]
        (end,) = cluster.events("end")
        assert end["reason"] == "stopping"
    finally:
        if watcher is not None:
            watcher.cancel()
        cluster.stop()


def test_shard_health_follows_its_load_and_its_stop(tmp_path: Path, channels, monkeypatch: pytest.MonkeyPatch) -> None:
    """ps-shard: "" SERVING once it listens (its coordinator's Load must reach it), its service once a
    coordinator loaded its range; both NOT_SERVING on SIGTERM. Its /metrics counts the Load's bytes."""
    monkeypatch.setitem(ENV, "PS_SHARD_KEY", "a-coordinator-key-for-tests")  # the shard's and its coordinator's
    port_file, metrics_port_file = tmp_path / "shard.port", tmp_path / "shard-metrics.port"
    shard = subprocess.Popen([sys.executable, "-m", "ps.shards.server", "--port", "0", "--port-file", str(port_file),
                              "--metrics-port", "0", "--metrics-port-file", str(metrics_port_file)],
                             env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    cluster = None
    watcher = None
    try:
        wait_for(lambda: port_file.exists() and port_file.read_text().strip() != "" or shard.poll() is not None, "the shard")
        channel = channels(f"127.0.0.1:{int(port_file.read_text())}")
        assert check(channel, "") == SERVING
        assert check(channel, SHARD) == NOT_SERVING
        assert SHARD in listed_services(channel)
        assert {"Load", "Commit", "Fetch", "Push", "Pull"} <= described_methods(channel, SHARD)
        watcher = Watcher(channel, SHARD)
        watcher.until(NOT_SERVING)

        cluster = start_server(tmp_path, [*JOB, "--shard-addresses", f"127.0.0.1:{int(port_file.read_text())}"])
        watcher.until(SERVING)  # the coordinator loaded its range before it listened
        assert check(channel, SHARD) == SERVING
        loaded = scrape(int(metrics_port_file.read_text()))  # --metrics-port: the shard's own message bytes
        assert value(loaded, "hetero_ps_grpc_received_bytes_total", method="Load") > 0

        shard.send_signal(signal.SIGTERM)
        assert shard.wait(30) == 0
        assert watcher.ended()
        assert watcher.seen == [NOT_SERVING, SERVING, NOT_SERVING]
    finally:
        if watcher is not None:
            watcher.cancel()
        if cluster is not None:
            cluster.stop()
        if shard.poll() is None:
            shard.kill()
            shard.wait()

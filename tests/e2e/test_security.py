"""TLS, mutual TLS and the shared token, against real `ps-server` and `ps-worker` processes.

Throwaway certificates (a CA, a server certificate for 127.0.0.1/localhost, client certificates)
are made with `cryptography` for each test module.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime
import ipaddress
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import torch
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

import ps.server
import ps.server_run
from protos import ps_pb2, ps_pb2_grpc
from common.transport.messages import PushMeta, PushTimes
from common.transport.security import TOKEN_ENV, bearer, resolve_token
from tests.processes import ENV, Cluster, start_server
from tests.tls_certs import Certs, certs  # noqa: F401 (a fixture)
from worker.cli import main as worker_main
from worker.transport.client import PSClient, ServerError

TOKEN = "s3cret-token_for.tests"
ENV_TOKEN = "token-from-the-environment"
JOB = ["--quiet", "--workers", "1", "--model-arg", "hidden=16", "--epochs", "1", "--global-batch", "64"]
RPC_TIMEOUT = 10.0




# ----------------------------------------------------------------------- servers
@dataclass
class Servers:
    tls: Cluster  # TLS, --token TOKEN given while $PS_TOKEN holds ENV_TOKEN: the flag wins
    mtls: Cluster  # mutual TLS, no --token: the token comes from $PS_TOKEN


@pytest.fixture(scope="module")
def servers(certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """Both servers, started side by side (each start imports torch: seconds)."""
    tls = ["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)]
    argv = {"tls": [*tls, "--token", TOKEN], "mtls": [*tls, "--tls-client-ca", str(certs.ca)]}
    with pytest.MonkeyPatch.context() as mp, concurrent.futures.ThreadPoolExecutor(2) as pool:
        mp.setitem(ENV, TOKEN_ENV, ENV_TOKEN)
        futures = {k: pool.submit(start_server, tmp_path_factory.mktemp(k), [*JOB, *v]) for k, v in argv.items()}
        started = {k: f.result() for k, f in futures.items()}
    try:
        yield Servers(**started)
    finally:
        for cluster in started.values():
            cluster.stop()


# ----------------------------------------------------------------------- helpers
def assert_refused(call: Callable[[], object], code: str, needle: str = "") -> None:
    with pytest.raises(ServerError) as info:
        call()
    assert info.value.code == code, info.value
    assert needle in info.value.message, info.value.message


def raw_status(channel: grpc.Channel, metadata: list[tuple[str, str]]) -> grpc.StatusCode:
    """The status code of a raw Status call."""
    try:
        ps_pb2_grpc.ParameterServerStub(channel).Status(ps_pb2.StatusRequest(), metadata=metadata, timeout=RPC_TIMEOUT)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def tls_channel(target: str, certs: Certs, client: tuple[Path, Path] | None = None) -> grpc.Channel:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=certs.ca.read_bytes(),
        private_key=client[1].read_bytes() if client else None,
        certificate_chain=client[0].read_bytes() if client else None,
    )
    return grpc.secure_channel(target, credentials)


# ------------------------------------------------------------------------ tests
def test_tls_and_token_gate_every_call_and_a_worker_trains(servers: Servers, certs: Certs) -> None:
    cluster = servers.tls
    with contextlib.closing(PSClient(cluster.target, token=TOKEN, tls_ca=certs.ca)) as good:
        before = good.status()
        assert len(before.workers) == 0
        for token, needle in (("wrong-token", "invalid token"), (ENV_TOKEN, "invalid token"), (None, "no token")):
            with contextlib.closing(PSClient(cluster.target, token=token, tls_ca=certs.ca)) as bad:
                assert_refused(lambda: bad.join("intruder", 1.0), "UNAUTHENTICATED", needle)
                assert_refused(bad.status, "UNAUTHENTICATED", needle)
                assert_refused(lambda: bad.push(PushMeta("w-0", 0, 0, 4, PushTimes(1.0), "float32"), torch.zeros(8),
                                                torch.empty(8)),
                               "UNAUTHENTICATED", needle)
                assert_refused(lambda: bad.leave("w-0"), "UNAUTHENTICATED", needle)
        with tls_channel(cluster.target, certs) as channel:  # the token without its scheme
            assert raw_status(channel, [("authorization", TOKEN)]) == grpc.StatusCode.UNAUTHENTICATED
        with grpc.insecure_channel(cluster.target) as plain:  # plaintext cannot even connect
            assert raw_status(plain, [bearer(TOKEN)]) == grpc.StatusCode.UNAVAILABLE
        with contextlib.closing(PSClient(cluster.target, token=TOKEN)) as plain_client:
            assert_refused(lambda: plain_client.wait_ready(2.0), "UNAVAILABLE")
        assert good.status() == before  # nothing joined, nothing changed
        # the token opens the server, not another worker's calls: those need that worker's secret
        probe = good.join("probe", 1.0, timeout=RPC_TIMEOUT)
        assert good.heartbeat(probe.worker_id).epoch == 0
        with contextlib.closing(PSClient(cluster.target, token=TOKEN, tls_ca=certs.ca)) as other:
            assert_refused(lambda: other.heartbeat(probe.worker_id), "UNAUTHENTICATED", "must carry the secret")
            assert_refused(lambda: other.leave(probe.worker_id), "UNAUTHENTICATED", "must carry the secret")
        with tls_channel(cluster.target, certs) as channel:
            forged = ps_pb2.HeartbeatRequest(worker_id=probe.worker_id, secret="0" * 64)
            with pytest.raises(grpc.RpcError) as info:
                ps_pb2_grpc.ParameterServerStub(channel).Heartbeat(forged, metadata=[bearer(TOKEN)], timeout=RPC_TIMEOUT)
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        good.leave(probe.worker_id)  # nobody left in the job: the worker below is admitted at once
    assert "warning" not in cluster.server_log()
    worker = cluster.start_worker("w0", "--tls-ca", str(certs.ca), "--token", TOKEN)
    code = cluster.wait(90)
    assert worker.returncode == 0, cluster.worker_log("w0")
    assert code == 0, cluster.server_log()


def test_mutual_tls_needs_a_client_certificate_from_the_ca(servers: Servers, certs: Certs) -> None:
    target = servers.mtls.target
    for client in (None, (certs.rogue_cert, certs.rogue_key)):
        with tls_channel(target, certs, client) as channel:
            assert raw_status(channel, [bearer(ENV_TOKEN)]) == grpc.StatusCode.UNAVAILABLE, client
    def mutual(token: str) -> contextlib.closing[PSClient]:
        return contextlib.closing(PSClient(target, token=token, tls_ca=certs.ca, tls_cert=certs.client_cert, tls_key=certs.client_key))

    with mutual(ENV_TOKEN) as good:  # the server took its token from $PS_TOKEN
        assert len(good.status().workers) == 0
    with mutual(TOKEN) as wrong:
        assert_refused(wrong.status, "UNAUTHENTICATED", "invalid token")


def test_token_without_tls_warns_once(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(ps.server_run, "build_job", lambda args: None)
    # validate, do not serve: the summary a finished job's loop returns
    monkeypatch.setattr(ps.server_run, "run_loop", lambda coro: coro.close() or {"reason": "finished"})
    assert ps.server.main(["--port", "0", "--token", TOKEN]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "in clear" in warnings[0] and TOKEN not in warnings[0]


def test_token_sources(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert resolve_token("flag", {TOKEN_ENV: "env"}) == "flag"
    assert resolve_token(None, {TOKEN_ENV: "env"}) == "env"
    assert resolve_token(None, {TOKEN_ENV: ""}) is None
    assert resolve_token(None, {}) is None
    for bad in ("", "has space", "naïve"):
        with pytest.raises(ValueError, match="--token"):
            resolve_token(bad, {})
    monkeypatch.setenv(TOKEN_ENV, "has space")  # ps-worker reads $PS_TOKEN when --token is absent
    assert worker_main(["--server", "127.0.0.1:1"]) == 2
    assert "$PS_TOKEN must be printable ASCII" in capsys.readouterr().err


def test_bad_server_security_flags_exit_2(
    tmp_path: Path, certs: Certs, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.setattr(ps.server_run, "build_job", lambda args: pytest.fail("security is checked before the job is built"))
    missing, garbage = tmp_path / "missing.pem", tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    cert, key = str(certs.server_cert), str(certs.server_key)
    cases = [
        (["--tls-cert", str(missing), "--tls-key", key], f"--tls-cert {missing}: cannot read"),
        (["--tls-cert", cert, "--tls-key", str(missing)], f"--tls-key {missing}: cannot read"),
        (["--tls-cert", str(garbage), "--tls-key", key], "not a PEM file"),
        (["--tls-cert", cert, "--tls-key", str(certs.client_key)], "not a matching certificate"),
        (["--tls-cert", cert, "--tls-key", key, "--tls-client-ca", str(missing)], "--tls-client-ca"),
        (["--tls-cert", cert], "go together"),
        (["--tls-client-ca", str(certs.ca)], "needs --tls-cert"),
        (["--token", ""], "--token is empty"),
    ]
    for argv, needle in cases:
        assert ps.server.main(["--port", "0", *argv]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and err.startswith("ps-server: error: ") and needle in err, err


def test_bad_worker_security_flags_exit_2(tmp_path: Path, certs: Certs, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.pem"
    cases = [
        (["--tls-ca", str(missing)], f"--tls-ca {missing}: cannot read"),
        (["--tls-ca", str(certs.ca), "--tls-cert", str(certs.client_cert)], "go together"),
        (["--tls-cert", str(certs.client_cert), "--tls-key", str(certs.client_key)], "need --tls-ca"),
        (["--tls-ca", str(certs.ca), "--tls-cert", str(missing), "--tls-key", str(certs.client_key)], "cannot read"),
    ]
    for argv, needle in cases:
        assert worker_main(["--server", "127.0.0.1:1", *argv]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and err.startswith("ps-worker: error: ") and needle in err, err

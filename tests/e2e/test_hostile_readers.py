"""A member of a real ps-server's job that opens Pulls and never reads them: gRPC writes a reply only
as its reader takes it, so each such Pull held its place among the calls held at once and the reply's
copy of the parameters for as long as its caller liked (one copy per parameter version: a member that
opened one every round made the server hold the model once per round, and --max-rpcs-per-peer such
Pulls kept every other caller at that address out). Each message of a reply must now be taken within
--push-idle, or the call is cancelled and lets go of both; and a member holds at most two Pulls at once."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from common.transport.security import bearer
from protos import ps_pb2, ps_pb2_grpc
from ps.serving.reply_stream import MAX_PULLS_HELD
from tests.processes import start_server

TOKEN = "hostile-readers-token"
PLACES = MAX_PULLS_HELD + 1  # --max-rpcs-per-peer: the data-plane calls one address holds at once
# mlp on digits with two hidden layers of 4,096: 17 million values, 68 MB a reply, far beyond what
# gRPC's windows take in before its reader reads
JOB = ["--quiet", "--workers", "1", "--model", "mlp", "--model-arg", "hidden=4096", "--model-arg", "layers=2",
       "--dataset", "digits", "--global-batch", "32", "--epochs", "1", "--token", TOKEN, "--push-idle", "2",
       "--max-rpcs-per-peer", str(PLACES)]
RPC_S = 30.0


def test_pulls_whose_replies_are_never_read_let_go_of_their_places_at_the_push_idle_bound(tmp_path: Path) -> None:
    """Two Pulls read as far as their header: the member's third is refused while they are held, though
    its address has a place left; past --push-idle the server has cancelled them, and a Pull that reads
    gets the whole model."""
    cluster = start_server(tmp_path, JOB)
    channels = [grpc.insecure_channel(cluster.target) for _ in range(MAX_PULLS_HELD + 1)]
    try:
        stub = ps_pb2_grpc.ParameterServerStub(channels[0])
        joined = stub.Join(ps_pb2.JoinRequest(name="reader", cores=1.0), metadata=(bearer(TOKEN),), timeout=RPC_S)
        request = ps_pb2.PullRequest(worker_id=joined.worker_id, secret=joined.secret)
        held = []
        for channel in channels[1:]:
            call = ps_pb2_grpc.ParameterServerStub(channel).Pull(request, metadata=(bearer(TOKEN),), timeout=RPC_S)
            assert next(call).header.num_values == joined.num_params  # the header; nothing more is read
            held.append(call)
        deadline = time.monotonic() + 2 + 10  # --push-idle, and time for the cancellations
        with pytest.raises(grpc.RpcError) as third:
            list(stub.Pull(request, metadata=(bearer(TOKEN),), timeout=RPC_S))
        assert third.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"holds {MAX_PULLS_HELD} Pulls already" in (third.value.details() or ""), third.value
        while True:
            try:
                whole = list(stub.Pull(request, metadata=(bearer(TOKEN),), timeout=RPC_S))
                break
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
                assert time.monotonic() < deadline, "the unread Pulls still hold every place of their address"
                time.sleep(0.5)
        assert whole[0].header.num_values == joined.num_params and sum(len(m.data) for m in whole) == 4 * joined.num_params
        assert cluster.server.poll() is None, cluster.server_log()
    finally:
        for channel in channels:
            channel.close()
        cluster.stop()

"""--allreduce auto's trial of both paths on CPU workers (ps/rounds/path_trial.py) against an in-process
server, driven by raw pushes: when it runs and why not, the switch onto the fast path (the replies carry
the parameters and the group), and the switch back (a snapshot from any member becomes the server's
parameters before a gradient is taken)."""

from __future__ import annotations

import concurrent.futures
import time

import grpc
import pytest
import torch

from protos import ps_pb2
from ps.rounds.path_trial import MEASURE_ROUNDS, SETTLE_ROUNDS
from tests.fast_path_jobs import TINY, call, report, snapshot_push
from tests.rpc_calls import SECRETS, TIMEOUT, expect_refused, first_pull, header, push, push_chunks, rand, sgd_step

AUTO = [a for a in TINY if a != "--allreduce"]  # --allreduce auto, the default
# 64 training samples at a global batch of 32: 2 rounds an epoch, 60 epochs (argparse takes the last --epochs)
TRIAL = [*AUTO, "--sampling", "independent", "--epochs", "60", "--lr", "0.1"]
Code = grpc.StatusCode


def _join(stub, name: str, switch: bool = True) -> ps_pb2.JoinReply:
    return first_pull(stub, stub.Join(ps_pb2.JoinRequest(name=name, cores=1.0, switch_paths=switch), timeout=TIMEOUT))


def _join_all(server, threads: concurrent.futures.Executor, switch: dict[str, bool]) -> dict[str, ps_pb2.JoinReply]:
    futures = {name: threads.submit(_join, server.stub(), name, ok) for name, ok in switch.items()}
    return {name: f.result(TIMEOUT) for name, f in futures.items()}


def _values_round(server, threads, ids: dict[str, str], round: int, grad: torch.Tensor):
    futures = {n: threads.submit(push, server.stub(), push_chunks(header(w, grad, round=round, version=round), grad))
               for n, w in ids.items()}
    return {n: f.result(TIMEOUT) for n, f in futures.items()}


def _status(server) -> ps_pb2.StatusReply:
    return server.stub().Status(ps_pb2.StatusRequest(), timeout=TIMEOUT)


@pytest.mark.parametrize(
    ("flags", "switch", "why"),
    [
        ([], {"a": True, "b": True}, "--sampling exact stays on the PS path"),
        (["--sampling", "independent"], {"a": True, "b": False}, "a worker cannot follow a switch"),
        (["--sampling", "independent", "--workers", "1"], {"a": True}, "one worker has no group to all-reduce with"),
    ],
)
def test_the_trial_runs_only_where_it_can_and_says_why(ps_server, threads, flags: list[str], switch: dict[str, bool],
                                                      why: str) -> None:
    server = ps_server(*AUTO, *flags)
    joins = _join_all(server, threads, switch)
    status = _status(server)
    assert status.path == "ps" and status.path_why.startswith("no worker has a GPU; ") and why in status.path_why, status
    assert server.call(lambda: server.coordinator.path_trial.phase) == "off"
    assert all(j.job_json.count('"allreduce": false') == 1 for j in joins.values())


def test_the_trial_switches_onto_the_fast_path_and_back_to_the_faster_ps_path(ps_server, threads) -> None:
    server = ps_server(*TRIAL)
    core = server.coordinator
    joins = _join_all(server, threads, {"a": True, "b": True})
    ids = {n: j.worker_id for n, j in joins.items()}
    assert "trying both paths, the PS path first" in _status(server).path_why
    numel = core.layout.numel
    grad = rand(numel, seed=3)
    # the PS path, timed at a held plan; the round whose close switches says so in its replies
    round = 0
    while True:
        replies = _values_round(server, threads, ids, round, grad)
        round += 1
        headers = [h for h, _ in replies.values()]
        if headers[0].path == "allreduce":
            break
        assert {h.path for h in headers} == {"ps"} and round < 100
    assert round >= SETTLE_ROUNDS + MEASURE_ROUNDS
    for h, params in replies.values():  # the parameters the group's copies start from, and the group
        assert (h.path, h.generation, h.world_size, h.num_values) == ("allreduce", 1, 2, numel)
        assert torch.equal(params, server.call(lambda: core.store.flat.clone()))
    assert _status(server).path == "allreduce"
    # the fast path, slower here: reports only, then the replies switch back and ask every member for a snapshot
    while True:
        time.sleep(0.05)
        futures = {n: threads.submit(call, server.stub(), report(w, round, generation=1)) for n, w in ids.items()}
        headers = [f.result(TIMEOUT) for f in futures.values()]
        round += 1
        if headers[0].path == "ps":
            break
        assert round < 200
    assert all(h.snapshot_requested and (h.generation, h.world_size) == (0, 0) for h in headers), headers
    status = _status(server)
    assert status.path == "ps" and status.path_why.startswith("kept the PS path: "), status.path_why
    # no gradient before the group's parameters are back on the server
    expect_refused(server, lambda: push(server.stub(), push_chunks(header(ids["a"], grad, round=round, version=round), grad)),
                   Code.FAILED_PRECONDITION, "waits for the fast path's parameters")
    theta = rand(numel, seed=5, scale=0.1)
    h, params = push(server.stub(), snapshot_push(ids["b"], theta, round))
    assert torch.equal(params, theta) and not h.snapshot_requested
    expect_refused(server, lambda: list(server.stub().Push(iter(snapshot_push(ids["a"], theta + 1, round)), timeout=TIMEOUT)),
                   Code.FAILED_PRECONDITION, "no snapshot was requested")
    replies = _values_round(server, threads, ids, round, grad)  # the PS path's round, stepped from the snapshot
    expected = sgd_step(theta, [(grad, 16), (grad, 16)], lr=0.1)
    for h, params in replies.values():
        assert (h.path, h.round) == ("ps", round + 1)
        torch.testing.assert_close(params, expected)
    assert server.call(lambda: core.path_trial.phase) == "decided"

"""Hostile values: gradients near the fp32 limit, rounds of large finite gradients and ASP updates
that could overflow are refused, or applied, without ever making the model non-finite."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterable
from typing import Any

import torch
from hypothesis import event

from protos import ps_pb2, ps_pb2_grpc
from tests.conftest import InProcessServer
from tests.state_compare import assert_same
from tests.hostile_peer import (
    Answer, INVALID, OK, PushSpec, SECRETS, TIMEOUT, ask, first_pulls, read_params, snapshot, start_server, stop_server,
)


# ---------------------------------------------------------------------------- overflow
def _join_all(server: InProcessServer, names: Iterable[str]) -> dict[str, str]:
    stub = ps_pb2_grpc.ParameterServerStub(server.channel())
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        joins = {n: pool.submit(lambda n=n: stub.Join(ps_pb2.JoinRequest(name=n, cores=1.0), timeout=TIMEOUT)) for n in names}
        replies = {n: f.result(2 * TIMEOUT) for n, f in joins.items()}
    SECRETS.update((r.worker_id, r.secret) for r in replies.values())
    first_pulls(stub, replies.values())
    return {n: r.worker_id for n, r in replies.items()}


def _push(server: InProcessServer, spec: PushSpec) -> Answer:
    stub = ps_pb2_grpc.ParameterServerStub(server.channel())
    return ask(lambda: read_params(stub.Push(iter(spec.chunks()), timeout=TIMEOUT)))


def _events(path: Any, name: str) -> list[dict[str, Any]]:
    from ps.ops.metrics import read_metrics

    return [e for e in read_metrics(path) if e["event"] == name]


def test_a_gradient_near_the_fp32_limit_is_refused_and_changes_nothing(tmp_path: Any) -> None:
    """The issue's BSP case: one of four workers pushes finite values of 3e38 with b = 32 of B = 128.
    Summed in fp32 as b·g that made every parameter +Inf; now the push is refused (INVALID_ARGUMENT,
    the state bit for bit as it was, an `overflow_refused` event), and the round closes normally."""
    log = tmp_path / "metrics.jsonl"
    server = start_server("--workers", "4", "--global-batch", "128", "--controller", "uniform", "--lr", "0.1",
                          "--momentum", "0.9", "--metrics-log", str(log))
    try:
        ids = _join_all(server, ["a", "b", "c", "d"])
        numel = server.coordinator.layout.numel
        before = snapshot(server)
        answer = _push(server, PushSpec(ids["a"], 0, 0, 32, 5.0, "float32", numel, fill=3e38))
        assert answer.code == INVALID and "overflow" in answer.details, answer
        assert_same(before, snapshot(server))
        assert [e["worker"] for e in _events(log, "overflow_refused")] == ["a"]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda n: _push(server, PushSpec(ids[n], 0, 0, 32, 5.0, "float32", numel, seed=ord(n))), ids))
        assert all(a.code == OK and a.value[0].round == 1 for a in answers), answers
        assert bool(torch.isfinite(answers[0].value[1]).all())
    finally:
        stop_server(server)


def test_rounds_of_large_finite_gradients_never_make_the_model_non_finite() -> None:
    """Momentum adds up: rounds of gradients of 2e37 (each far from the fp32 limit) with lr 1 and
    momentum 0.9 reached +Inf within ten rounds. Now every round either steps to finite values or its
    pushes are refused, leaving the parameters and the momentum as they were (then both workers push
    zeros, until even that could overflow: the momentum alone would carry the parameters past it)."""
    server = start_server("--workers", "2", "--global-batch", "32", "--controller", "uniform", "--lr", "1",
                          "--momentum", "0.9", "--epochs", "1000")
    pool = concurrent.futures.ThreadPoolExecutor(2)
    try:
        ids = _join_all(server, ["a", "b"])
        numel = server.coordinator.layout.numel

        def both(round_: int, fill: float) -> list[Answer]:
            specs = [PushSpec(ids[n], round_, round_, 16, 5.0, "float32", numel, fill=fill) for n in ("a", "b")]
            return list(pool.map(lambda spec: _push(server, spec), specs))

        refused = 0
        for round_ in range(12):
            before = snapshot(server)
            answers = both(round_, 2e37)
            if all(a.code == INVALID and "overflow" in a.details for a in answers):
                assert_same(before, snapshot(server))
                refused += 1
                answers = both(round_, 0.0)
                if all(a.code == INVALID for a in answers):
                    assert_same(before, snapshot(server))
                    break
            assert all(a.code == OK for a in answers), answers
            store = server.coordinator.store
            state = server.call(lambda: [store.flat.clone(), store.flat_optimizer_state()])
            assert all(bool(torch.isfinite(t).all()) for t in state), f"round {round_}"
        assert refused, "no push was refused: the test no longer reaches the limit"
    finally:
        stop_server(server)
        pool.shutdown(wait=True, cancel_futures=True)


def test_asp_updates_that_could_overflow_are_refused_and_change_nothing() -> None:
    """The issue's ASP case: two updates of 2e38 made the parameters +Inf; each is refused now."""
    server = start_server("--mode", "asp", "--workers", "2", "--global-batch", "32")
    try:
        ids = _join_all(server, ["a", "b"])
        numel = server.coordinator.layout.numel
        for name in ("a", "b"):
            before = snapshot(server)
            answer = _push(server, PushSpec(ids[name], 0, 0, 16, 5.0, "float32", numel, fill=2e38))
            assert answer.code == INVALID and "overflow" in answer.details, answer
            assert_same(before, snapshot(server))
        assert bool(torch.isfinite(snapshot(server)["flat"]).all())
    finally:
        stop_server(server)

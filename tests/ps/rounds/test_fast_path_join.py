"""The BSP collective fast path (`ps-server --allreduce`) against an in-process server: the groups
and ranks a join hands out, when --allreduce auto takes it, and its flags."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
import torch

from protos import ps_pb2
from ps.ops.metrics import read_metrics
from ps.rounds.rendezvous import fast_path_fits
from ps.server import main as server_main
from tests.rpc_calls import SECRETS, TIMEOUT, expect_refused, first_pull, header, join_all, push_chunks, rand
from tests.fast_path_jobs import Code, TINY, call, report, report_round


# ------------------------------------------------------- protocol, in process
def test_join_hands_out_the_group_and_ranks(ps_server, threads) -> None:
    server = ps_server(*TINY)
    joins = join_all(server, threads, {"a": 1.0, "b": 1.0})
    assert sorted(j.rank for j in joins.values()) == [0, 1]
    for j in joins.values():
        assert (j.world_size, j.generation, j.backend) == (2, 1, "gloo")
    assert '"allreduce": true' in joins["a"].job_json
    h = server.stub().Pull(ps_pb2.PullRequest(worker_id=joins["a"].worker_id, secret=SECRETS[joins["a"].worker_id], header_only=True), timeout=TIMEOUT)
    (only,) = list(h)
    assert only.header.num_values == 0 and only.header.generation == 1


def test_every_plan_names_the_worker_with_the_largest_batch_as_hub(ps_server, threads) -> None:
    server = ps_server(*[a if a != "uniform" else "static" for a in TINY], "--workers", "3")
    joins = join_all(server, threads, {"slow": 1.0, "fast": 3.0, "mid": 2.0})
    plans = {}
    for name, j in joins.items():
        (only,) = list(server.stub().Pull(ps_pb2.PullRequest(worker_id=j.worker_id, secret=SECRETS[j.worker_id], header_only=True), timeout=TIMEOUT))
        plans[name] = only.header
    assert plans["fast"].batch_size > plans["mid"].batch_size > plans["slow"].batch_size
    assert {p.hub_rank for p in plans.values()} == {joins["fast"].rank}


def _join_on(stub, name: str, gpu: str | None) -> ps_pb2.JoinReply:
    return first_pull(stub, stub.Join(ps_pb2.JoinRequest(name=name, cores=1.0, cuda=gpu is not None,
                                                         cuda_device=gpu or ""), timeout=TIMEOUT))


@pytest.mark.parametrize(
    ("gpus", "backend", "why"),
    [(("GPU-a", "GPU-b"), "nccl", ""), (("GPU-a", "GPU-a"), "gloo", "share GPU GPU-a"), (("GPU-a", None), "gloo", "no GPU")],
)
def test_join_plans_nccl_only_for_workers_on_distinct_gpus(
    ps_server, threads, gpus: tuple[str | None, ...], backend: str, why: str
) -> None:
    server = ps_server(*TINY)
    futures = [threads.submit(_join_on, server.stub(), f"w{i}", gpu) for i, gpu in enumerate(gpus)]
    assert {f.result(TIMEOUT).backend for f in futures} == {backend}
    group = server.coordinator.rendezvous.group
    assert (group.generation, group.backend) == (1, backend) and why in group.why and bool(group.why) == bool(why)


# --allreduce auto (the default): the fast path when the starting workers all have GPUs of their own
AUTO = [a for a in TINY if a != "--allreduce"]


def _path_events(path: Path) -> list[dict]:
    return [e for e in read_metrics(path) if e["event"] == "path"]


def test_fast_path_fits_only_workers_on_gpus_of_their_own() -> None:
    assert fast_path_fits(["a", "b"], {"a": "GPU-1", "b": "GPU-2"}) == (True, "every worker computes on a GPU of its own")
    assert fast_path_fits(["a"], {"a": ""}) == (True, "every worker computes on a GPU of its own")  # UUID unknown
    assert fast_path_fits(["a", "b"], {"a": None, "b": None}) == (False, "no worker has a GPU")
    assert fast_path_fits(["a", "b"], {"a": "GPU-1", "b": None}) == (False, "1 of 2 workers have no GPU")
    assert fast_path_fits(["a", "b"], {"a": "GPU-1", "b": "GPU-1"}) == (False, "a and b share GPU GPU-1")


def test_auto_takes_the_fast_path_when_every_worker_has_its_own_gpu(ps_server, threads, tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    server = ps_server(*AUTO, "--metrics-log", str(log))
    core = server.coordinator
    assert core.fast_path.undecided and core.rendezvous is None and not core.spec.allreduce
    assert server.stub().Status(ps_pb2.StatusRequest(), timeout=TIMEOUT).path == "auto"  # not chosen yet
    futures = {name: threads.submit(_join_on, server.stub(), name, gpu) for name, gpu in (("a", "GPU-a"), ("b", "GPU-b"))}
    joins = {name: f.result(TIMEOUT) for name, f in futures.items()}
    assert core.rendezvous is not None
    for j in joins.values():
        assert '"allreduce": true' in j.job_json and '"balance": "compute"' in j.job_json
        assert (j.world_size, j.generation, j.backend) == (2, 1, "nccl")
    assert not core.fast_path.undecided
    assert server.stub().Status(ps_pb2.StatusRequest(), timeout=TIMEOUT).path == "allreduce"
    (path,) = _path_events(log)
    assert (path["allreduce"], path["why"], path["balance"]) == (True, "every worker computes on a GPU of its own", "compute")
    ids = {n: j.worker_id for n, j in joins.items()}
    grad = rand(core.layout.numel, seed=1)
    expect_refused(server, lambda: list(server.stub().Push(iter(push_chunks(header(ids["a"], grad), grad)), timeout=TIMEOUT)),
                   Code.INVALID_ARGUMENT, "collective fast path (--allreduce)")
    theta0 = server.call(lambda: core.store.flat.clone())
    assert {h.round for h in report_round(server.stub, threads, ids, 0).values()} == {1}  # rounds close on reports
    assert torch.equal(server.call(lambda: core.store.flat.clone()), theta0)
    assert server.call(lambda: core.summary()["allreduce"]) is True


@pytest.mark.parametrize(
    ("extra", "gpus", "why"),
    [
        ([], ("GPU-a", None), "1 of 2 workers have no GPU"),
        ([], ("GPU-a", "GPU-a"), "share GPU GPU-a"),
        ([], (None, None), "no worker has a GPU"),
        (["--allreduce", "off"], ("GPU-a", "GPU-b"), None),  # no choice made: no path event
        (["--balance", "busy"], ("GPU-a", "GPU-b"), None),  # busy time is a PS-path time
        (["--balance", "cycle"], ("GPU-a", "GPU-b"), None),
    ],
)
def test_auto_stays_on_the_ps_path_otherwise(
    ps_server, threads, tmp_path: Path, extra: list[str], gpus: tuple[str | None, ...], why: str | None
) -> None:
    log = tmp_path / "metrics.jsonl"
    server = ps_server(*AUTO, *extra, "--metrics-log", str(log))
    core = server.coordinator
    futures = {name: threads.submit(_join_on, server.stub(), name, gpu) for name, gpu in zip("ab", gpus)}
    joins = {name: f.result(TIMEOUT) for name, f in futures.items()}
    for j in joins.values():
        assert '"allreduce": false' in j.job_json and (j.world_size, j.generation) == (0, 0)
    assert core.rendezvous is None and not core.fast_path.undecided
    assert server.stub().Status(ps_pb2.StatusRequest(), timeout=TIMEOUT).path == "ps"
    events = _path_events(log)
    if why is None:
        assert events == []
    else:
        (path,) = events
        assert (path["allreduce"], path["balance"]) == (False, "busy") and why in path["why"], path
    grad = rand(core.layout.numel, seed=1)  # a PS-path push is taken
    ids = {n: j.worker_id for n, j in joins.items()}
    expect_refused(server, lambda: list(server.stub().Push(iter(report(ids["a"], 0)), timeout=TIMEOUT)),
                   Code.INVALID_ARGUMENT, "a report push is for --allreduce jobs")
    futures = {n: threads.submit(lambda w=w: list(server.stub().Push(iter(push_chunks(header(w, grad, batch_size=16), grad)),
                                                                     timeout=TIMEOUT))) for n, w in ids.items()}
    assert all(f.result(TIMEOUT)[0].header.round == 1 for f in futures.values())


def test_a_malformed_gpu_uuid_is_refused_and_changes_nothing(ps_server) -> None:
    server = ps_server(*TINY)
    for bad in ("G" * 129, "GPU-1\n"):
        with pytest.raises(grpc.RpcError) as info:
            _join_on(server.stub(), "w0", bad)
        assert info.value.code() == Code.INVALID_ARGUMENT and "GPU UUID" in info.value.details()
    # declarations live on members (Member.cuda_device): none was admitted, active or pending
    assert not server.coordinator.membership.pending and not server.coordinator.members


# ------------------------------------------------------------- the command line
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--mode", "asp", "--allreduce"], "--allreduce is the BSP collective fast path; it cannot run with --mode asp"),
        (["--allreduce", "--rendezvous-port", "29500"], "unrecognized arguments: --rendezvous-port 29500"),
        (["--allreduce", "off", "--allreduce-algorithm", "hub"], "--allreduce-algorithm needs --allreduce (on, or auto"),
        # auto cannot take the fast path where busy time or the cycle is asked for, or with shards
        (["--balance", "busy", "--allreduce-algorithm", "hub"], "--allreduce-algorithm needs --allreduce (on, or auto"),
        (["--mode", "asp", "--allreduce", "on"], "--allreduce is the BSP collective fast path"),
    ],
)
def test_bad_allreduce_flags_are_refused(args: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = server_main(["--port", "0", "--quiet", *args])
    except SystemExit as exit_:  # argparse's own type checks exit with its usage line
        code = exit_.code
    assert code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("usage:")]
    assert err and err[-1].startswith(f"ps-server: error: {needle}"), err

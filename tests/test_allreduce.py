"""The BSP collective fast path (`ps-server --allreduce`): protocol checks against an in-process
server, and real processes on gloo: equal to the PS path, and re-forming the group when a worker leaves."""

from __future__ import annotations

import concurrent.futures
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import torch
from torch.distributed import TCPStore

from protos import ps_pb2
from common.job.models import build_model
from common.job.spec import JobSpec
from ps.ops.metrics import read_metrics
from ps.checkpoint import checkpoint_files, read_checkpoint
from common.params.store import ParameterStore
from ps.rounds.rendezvous import Group, fast_path_fits, hub_rank, plan_group
from ps.server import main as server_main
from common.transport.layout import flatten_params
from tests import collective_ranks
from tests.processes import ENV, Cluster, start_server
from tests.test_hostile import wait_until
from tests.test_rpc import SECRETS, TIMEOUT, expect_refused, header, join_all, push_chunks, rand
from worker import connect
from worker.cli import train
from common.transport.messages import GroupInfo, StepHeader
from worker.client import PSClient, ServerError
from worker.client import reachable_address
from worker.collective import Collective

Code = grpc.StatusCode
# a tiny job for the in-process tests: 64 training samples, so an epoch is two rounds of 32
TINY = ["--allreduce", "--dataset", "synthetic", "--dataset-arg", "size=80", "--dataset-arg", "image_size=4",
        "--dataset-arg", "channels=1", "--global-batch", "32", "--controller", "uniform", "--epochs", "2"]


def call(stub, chunks: list[ps_pb2.PushChunk]) -> ps_pb2.ParamsHeader:
    """A push whose reply carries no parameters: returns the header."""
    messages = list(stub.Push(iter(chunks), timeout=TIMEOUT))
    assert messages[0].header.num_values == 0 and all(not m.data for m in messages)
    return messages[0].header


def report(worker_id: str, round: int, batch: int = 16, generation: int = 0) -> list[ps_pb2.PushChunk]:
    return push_chunks(header(worker_id, 0, round=round, batch_size=batch, kind=ps_pb2.PUSH_REPORT, generation=generation),
                       torch.empty(0))


def snapshot_push(worker_id: str, values: torch.Tensor, round: int) -> list[ps_pb2.PushChunk]:
    return push_chunks(header(worker_id, values, round=round, batch_size=0, kind=ps_pb2.PUSH_SNAPSHOT), values)


def report_round(ps_server_stub, threads: concurrent.futures.Executor, ids: dict[str, str], round: int) -> dict[str, ps_pb2.ParamsHeader]:
    futures = {name: threads.submit(call, ps_server_stub(), report(wid, round)) for name, wid in ids.items()}
    return {name: f.result(TIMEOUT) for name, f in futures.items()}


# ------------------------------------------------------------------ pure parts
def test_group_backend_is_nccl_only_when_every_worker_has_its_own_gpu() -> None:
    assert plan_group(3, ["a", "b"], {"a": "GPU-1", "b": "GPU-2"}) == Group(3, ("a", "b"), "nccl")
    assert plan_group(3, ["a", "b"], {"a": "", "b": ""}).backend == "nccl"  # UUIDs unknown: trusted to differ
    # NCCL refuses two ranks on one GPU ("Duplicate GPU detected", seen on an H100): gloo instead of a hang
    shared = plan_group(3, ["a", "b", "c"], {"a": "GPU-1", "b": "GPU-2", "c": "GPU-1"})
    assert (shared.backend, shared.why) == ("gloo", "a and c share GPU GPU-1")
    mixed = plan_group(3, ["a", "b"], {"a": "GPU-1", "b": None})
    assert (mixed.backend, mixed.why) == ("gloo", "1 of 2 workers have no GPU")
    assert plan_group(3, ["a", "b"], {"a": None}) == Group(3, ("a", "b"), "gloo", "")  # all on CPUs: nothing to explain
    group = plan_group(3, ["b", "a"], {})
    assert (group.generation, group.world_size, group.rank("a"), group.rank("zz"), group.backend) == (3, 2, 1, -1, "gloo")


def test_reachable_address_falls_back_to_the_server_host() -> None:
    assert reachable_address("0.0.0.0", 7, "10.1.2.3:50051") == ("10.1.2.3", 7)
    assert reachable_address("", 7, "[::1]:50051") == ("::1", 7)
    assert reachable_address("127.0.0.1", 7, "10.1.2.3:50051") == ("127.0.0.1", 7)


def test_bucketed_step_equals_the_server_optimizer_step() -> None:
    """Several buckets in flight, then the server's optimizer (momentum, weight decay) on the local copy
    (a group of one, in this process: the reduction is the identity)."""
    spec = JobSpec(workers=1, global_batch=8, momentum=0.9, weight_decay=1e-3, nesterov=True)
    model = build_model("mlp", (64,), 10, {"hidden": 16}, 0)
    reference = ParameterStore.of_model(model, spec)
    host = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    collective = Collective(spec, model, "127.0.0.1", host.port, timeout_s=30, bucket_bytes=1024)
    try:
        assert collective.bucket_numel * 3 < reference.numel
        for round in range(3):
            grads = rand(reference.numel, seed=round)
            plan = StepHeader(round, round, 0, 8, False, 0.0, 8, group=GroupInfo(1, 0, 1, "gloo"))
            assert collective.step(grads, 8, plan)
            reference.apply_gradient(grads.clone())
        assert collective.round == 3 and collective.reduces == 3
        torch.testing.assert_close(collective.params, reference.flat, rtol=0, atol=1e-7)
    finally:
        collective.close()


def test_the_round_check_holds_past_the_rounds_fp32_can_count() -> None:
    """Each rank adds its round into the fp32 bucket to check the group is in step; the round itself
    stops being exact in fp32 at 2^24 + 1, so the check adds it modulo ROUND_CHECK_MODULUS (it raised
    "collective out of step" at round 16,777,217 before)."""
    spec = JobSpec(workers=1, global_batch=8)
    model = build_model("mlp", (64,), 10, {"hidden": 16}, 0)
    host = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    collective = Collective(spec, model, "127.0.0.1", host.port, timeout_s=30)
    try:
        for round in (2**24, 2**24 + 1, 2**31 + 3):
            plan = StepHeader(round, round, 0, 8, False, 0.0, 8, group=GroupInfo(1, 0, 1, "gloo"))
            assert collective.step(torch.zeros(collective.params.numel()), 8, plan)
        assert collective.round == 2**31 + 4
    finally:
        collective.close()


@pytest.mark.parametrize("algorithm", ["hub", "ring"])
def test_a_group_of_three_reduces_to_the_batch_weighted_mean(tmp_path: Path, algorithm: str) -> None:
    """Three ranks in their own processes (gloo), several bucket parts, a hub that is not rank 0 and
    moves, one rank further along than the others when the group forms (they adopt its parameters and
    momentum): every rank ends with the same bits, equal to the same steps taken in one process."""
    world = 3
    host = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    outs = [tmp_path / f"rank{r}.pt" for r in range(world)]
    procs = [
        subprocess.Popen([sys.executable, "-m", "tests.collective_ranks", str(r), str(world), str(host.port), algorithm,
                          str(outs[r])], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(world)
    ]
    for proc in procs:
        output, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, output
    saved = [torch.load(out) for out in outs]
    assert all(torch.equal(saved[0]["params"], s["params"]) and torch.equal(saved[0]["state"], s["state"]) for s in saved[1:])
    reference = ParameterStore.of_model(collective_ranks.model(), collective_ranks.spec(world, algorithm))
    assert _bucket_parts(reference.numel) > 2
    for round in range(collective_ranks.PRE):
        reference.apply_gradient(collective_ranks.veteran_grads(round, reference.numel))
    for round in range(collective_ranks.PRE, collective_ranks.PRE + collective_ranks.ROUNDS):
        total = sum(collective_ranks.batch(r, round) for r in range(world))
        mean = sum(collective_ranks.batch(r, round) * collective_ranks.grads(r, round, reference.numel) for r in range(world))
        reference.apply_gradient(mean / total)
    torch.testing.assert_close(saved[0]["params"], reference.flat, rtol=0, atol=1e-6)
    torch.testing.assert_close(saved[0]["state"], reference.flat_optimizer_state(), rtol=0, atol=1e-6)


def _bucket_parts(numel: int) -> int:
    return -(-(numel + 3) * 4 // collective_ranks.BUCKET_BYTES)


def test_the_hub_is_the_largest_batch_and_the_lowest_rank_among_equals() -> None:
    group = Group(1, ("a", "b", "c"), "gloo")
    assert hub_rank(group, {"a": 10, "b": 30, "c": 20}) == 1
    assert hub_rank(group, {"a": 10, "b": 30, "c": 30}) == 1
    assert hub_rank(group, {"c": 5}) == 2
    assert hub_rank(group, {}) == 0
    assert hub_rank(Group(0, (), "gloo"), {"a": 1}) == 0


def test_the_algorithm_is_checked() -> None:
    assert JobSpec(allreduce=True).hub_reduce("gloo") and not JobSpec(allreduce=True).hub_reduce("nccl")
    assert JobSpec(allreduce=True, allreduce_algorithm="hub").hub_reduce("nccl")
    assert not JobSpec(allreduce=True, allreduce_algorithm="ring").hub_reduce("gloo")
    with pytest.raises(ValueError, match="allreduce algorithm must be one of"):
        JobSpec(allreduce=True, allreduce_algorithm="tree")


# ------------------------------------------------------- protocol, in process
def test_join_hands_out_the_rendezvous_and_ranks(ps_server, threads) -> None:
    server = ps_server(*TINY)
    joins = join_all(server, threads, {"a": 1.0, "b": 1.0})
    port = server.coordinator.rendezvous.port
    assert port > 0
    assert sorted(j.rank for j in joins.values()) == [0, 1]
    for j in joins.values():
        assert (j.rendezvous_host, j.rendezvous_port, j.world_size, j.generation, j.backend) == ("127.0.0.1", port, 2, 1, "gloo")
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
    reply = stub.Join(ps_pb2.JoinRequest(name=name, cores=1.0, cuda=gpu is not None, cuda_device=gpu or ""), timeout=TIMEOUT)
    SECRETS[reply.worker_id] = reply.secret
    return reply


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
    assert core.may_take_fast_path and core.rendezvous is None and not core.spec.allreduce
    assert server.stub().Status(ps_pb2.StatusRequest(), timeout=TIMEOUT).path == "auto"  # not chosen yet
    futures = {name: threads.submit(_join_on, server.stub(), name, gpu) for name, gpu in (("a", "GPU-a"), ("b", "GPU-b"))}
    joins = {name: f.result(TIMEOUT) for name, f in futures.items()}
    port = core.rendezvous.port
    for j in joins.values():
        assert '"allreduce": true' in j.job_json and '"balance": "compute"' in j.job_json
        assert (j.rendezvous_port, j.world_size, j.generation, j.backend) == (port, 2, 1, "nccl")
    assert not core.may_take_fast_path
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
        assert '"allreduce": false' in j.job_json and (j.rendezvous_port, j.world_size) == (0, 0)
    assert core.rendezvous is None and not core.may_take_fast_path
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


def test_auto_stays_on_the_ps_path_when_the_rendezvous_cannot_start(ps_server, threads, tmp_path: Path) -> None:
    taken = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    log = tmp_path / "metrics.jsonl"
    server = ps_server(*AUTO, "--rendezvous-port", str(taken.port), "--metrics-log", str(log))
    futures = [threads.submit(_join_on, server.stub(), name, gpu) for name, gpu in (("a", "GPU-a"), ("b", "GPU-b"))]
    assert all('"allreduce": false' in f.result(TIMEOUT).job_json for f in futures)
    (path,) = _path_events(log)
    assert not path["allreduce"] and path["why"].startswith("every worker computes on a GPU of its own, but cannot host "
                                                             f"the rendezvous store on 127.0.0.1:{taken.port}")


def test_a_malformed_gpu_uuid_is_refused_and_changes_nothing(ps_server) -> None:
    server = ps_server(*TINY)
    for bad in ("G" * 129, "GPU-1\n"):
        with pytest.raises(grpc.RpcError) as info:
            _join_on(server.stub(), "w0", bad)
        assert info.value.code() == Code.INVALID_ARGUMENT and "GPU UUID" in info.value.details()
    # declarations live on members (Member.cuda_device): none was admitted, active or pending
    assert not server.coordinator.membership.pending and not server.coordinator.members


def test_pushes_of_the_wrong_kind_are_refused_without_a_trace(ps_server, threads) -> None:
    server = ps_server(*TINY)
    ids = {n: j.worker_id for n, j in join_all(server, threads, {"a": 1.0, "b": 1.0}).items()}
    stub, numel = server.stub(), server.coordinator.layout.numel
    grad = rand(numel, seed=1)
    rank1 = next(w for w in ids.values() if server.coordinator.rendezvous.rank(w) == 1)
    rank0 = next(w for w in ids.values() if w != rank1)
    cases = [
        (push_chunks(header(ids["a"], grad), grad), Code.INVALID_ARGUMENT, "collective fast path (--allreduce)"),
        (push_chunks(header(ids["a"], 4, kind=ps_pb2.PUSH_REPORT), torch.ones(4)), Code.INVALID_ARGUMENT,
         "a report carries no values (num_values 0), got 4"),
        (report(ids["a"], round=1), Code.FAILED_PRECONDITION, "round 1 is not open"),
        (report(ids["a"], round=0, batch=0), Code.INVALID_ARGUMENT, "batch size must be > 0"),
        (report(ids["a"], round=0, generation=2), Code.INVALID_ARGUMENT, "a report's generation must be in [0, 1]"),
        (report(ids["a"], round=0, generation=-1), Code.INVALID_ARGUMENT, "a report's generation must be in [0, 1]"),
        (snapshot_push(rank1, grad, 0), Code.FAILED_PRECONDITION, "only rank 0 sends snapshots", "rank 1 of generation 1"),
        (snapshot_push(rank0, grad, 0), Code.FAILED_PRECONDITION, "no snapshot was requested"),
        (push_chunks(header(ids["a"], grad, kind=7), grad), Code.INVALID_ARGUMENT, "push kind must be one of"),
    ]
    for chunks, code, *fragments in cases:
        expect_refused(server, lambda chunks=chunks: list(stub.Push(iter(chunks), timeout=TIMEOUT)), code, *fragments)
    assert server.call(lambda: (server.coordinator.bsp.round_batch, server.coordinator.whole_model.snapshot_requested)) == (0, False)


def test_reports_in_a_ps_job_are_refused(ps_server, threads) -> None:
    server = ps_server("--global-batch", "32")
    ids = {n: j.worker_id for n, j in join_all(server, threads, {"a": 1.0, "b": 1.0}).items()}
    stub = server.stub()
    expect_refused(server, lambda: list(stub.Push(iter(report(ids["a"], 0)), timeout=TIMEOUT)), Code.INVALID_ARGUMENT,
                   "a report push is for --allreduce jobs")


def test_rounds_close_on_reports_and_rank0_snapshots_at_epoch_end(ps_server, threads, tmp_path: Path) -> None:
    server = ps_server(*TINY, "--checkpoint-dir", str(tmp_path))
    core = server.coordinator
    ids = {n: j.worker_id for n, j in join_all(server, threads, {"a": 1.0, "b": 1.0}).items()}
    theta0 = server.call(lambda: core.store.flat.clone())
    first = report_round(server.stub, threads, ids, 0)
    assert {(h.round, h.epoch, h.generation, h.snapshot_requested) for h in first.values()} == {(1, 0, 1, False)}
    assert torch.equal(server.call(lambda: core.store.flat.clone()), theta0)  # no gradient applied on the server
    second = report_round(server.stub, threads, ids, 1)  # 64 samples: epoch 1 ends
    rank0 = next(n for n, w in ids.items() if core.rendezvous.rank(w) == 0)
    assert {n: h.snapshot_requested for n, h in second.items()} == {n: n == rank0 for n in ids}
    assert all(h.round == 2 and h.epoch == 1 for h in second.values())
    assert core.evaluation.results == [] and not list(tmp_path.glob("ckpt-*"))  # both wait for the snapshot
    params = theta0 + rand(theta0.numel(), seed=3)
    h = call(server.stub(), snapshot_push(ids[rank0], params, 2))
    assert not h.snapshot_requested and h.round == 2
    assert torch.equal(server.call(lambda: core.store.flat.clone()), params)
    server.job.checkpointer.flush()
    (ckpt,) = checkpoint_files(tmp_path)
    assert torch.equal(read_checkpoint(ckpt)["params"], params) and read_checkpoint(ckpt)["round"] == 2
    deadline = time.monotonic() + TIMEOUT
    while not core.evaluation.results and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [e[0] for e in core.evaluation.results] == [1]


def test_a_snapshot_carries_the_optimizer_state_and_a_pull_hands_it_back(ps_server, threads) -> None:
    """Rank 0's snapshot is the parameters, then the momentum buffer (common.params.flat_state); the server keeps
    both (what its checkpoints hold) and hands the momentum to a worker that asks (after a resume).
    A snapshot of another size, or a non-finite state, is refused and changes nothing."""
    server = ps_server(*TINY, "--momentum", "0.9")
    core = server.coordinator
    ids = {n: j.worker_id for n, j in join_all(server, threads, {"a": 1.0, "b": 1.0}).items()}
    client = PSClient(server.target)
    for worker_id in ids.values():
        client.use_secret(worker_id, SECRETS[worker_id])
    try:
        assert client.pull_optimizer_state(ids["a"], core.store.numel) is None  # not stepped yet
        report_round(server.stub, threads, ids, 0)
        second = report_round(server.stub, threads, ids, 1)
        rank0 = next(n for n, h in second.items() if h.snapshot_requested)
        n = server.call(lambda: core.store.numel)
        params, momentum = rand(n, seed=4), rand(n, seed=5)
        nan_state = torch.cat([params, momentum])
        nan_state[n + 7] = float("nan")
        stub = server.stub()
        for values, needle in [
            (torch.cat([params, momentum[:-1]]), f"a snapshot has {2 * n - 1} values; the layout expects {n} or {2 * n}"),
            (nan_state, "NaN or Inf"),
        ]:
            chunks = snapshot_push(ids[rank0], values, 2)
            expect_refused(server, lambda c=chunks: list(stub.Push(iter(c), timeout=TIMEOUT)), Code.INVALID_ARGUMENT, needle)
        call(stub, snapshot_push(ids[rank0], torch.cat([params, momentum]), 2))
        state = server.call(lambda: core.store.optimizer_state())
        assert torch.equal(state["state"][0]["momentum_buffer"], momentum) and state["param_groups"][0]["momentum"] == 0.9
        assert torch.equal(server.call(lambda: core.store.flat.clone()), params)
        assert torch.equal(client.pull_optimizer_state(ids["b"], n), momentum)
        flags = [m.header.optimizer_state for m in (
            next(iter(stub.Pull(ps_pb2.PullRequest(worker_id=ids["b"], secret=SECRETS[ids["b"]], **extra), timeout=TIMEOUT)))
            for extra in ({"optimizer_state": True}, {}))]
        assert flags == [True, False]  # the reply says what its payload is
        report_round(server.stub, threads, ids, 2)
        fourth = report_round(server.stub, threads, ids, 3)  # epoch 2 ends: the job's last snapshot
        rank0 = next(n for n, h in fourth.items() if h.snapshot_requested)
        call(stub, snapshot_push(ids[rank0], params, 4))  # parameters alone: an optimizer without state
        assert server.call(lambda: core.store.optimizer_state())["state"] == {}
    finally:
        client.close()


def test_a_server_without_optimizer_state_pulls_leaves_the_momentum_at_zero(tmp_path: Path) -> None:
    """A server that predates `PullRequest.optimizer_state` ignores the field and sends parameters,
    without the reply's `optimizer_state` flag: the worker must not load them as its momentum."""
    def old_pull(request: bytes, context: grpc.ServicerContext):
        yield ps_pb2.ParamsChunk(header=ps_pb2.ParamsHeader(num_values=4, wire_dtype="float32")).SerializeToString()
        yield ps_pb2.ParamsChunk(seq=1, data=torch.ones(4).numpy().tobytes()).SerializeToString()

    handler = grpc.method_handlers_generic_handler(
        "hetero_ps.ParameterServer", {"Pull": grpc.unary_stream_rpc_method_handler(old_pull)})
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    client = PSClient(f"127.0.0.1:{port}")
    try:
        assert client.pull_optimizer_state("w-0", 4) is None
    finally:
        client.close()
        server.stop(None)


def report_then_leave(server, threads, ids: dict[str, str], reporter: str, leaver: str) -> ps_pb2.ParamsHeader:
    """`reporter` reports round 0 and waits; once the server has it, `leaver` leaves; the report's reply."""
    pending = threads.submit(call, server.stub(), report(ids[reporter], 0))
    wait_until(lambda: server.call(lambda: server.coordinator.bsp.round_batch) > 0, f"{reporter}'s report")
    server.stub().Leave(ps_pb2.LeaveRequest(worker_id=ids[leaver], secret=SECRETS[ids[leaver]]), timeout=TIMEOUT)
    return pending.result(TIMEOUT)


def test_a_report_carries_the_batch_told_for_its_round_or_the_one_before(ps_server, threads) -> None:
    """The fast path's worker draws its batch before it reads its previous report's reply, so a report
    for round r may carry what it was told for r or r - 1, and nothing else. c leaves after round 0:
    the re-split (24 each) reaches a and b in round 1's replies, after they drew round 1's batches of 16."""
    server = ps_server(*TINY, "--workers", "3", "--global-batch", "48", "--epochs", "50")
    ids = {n: j.worker_id for n, j in join_all(server, threads, {"a": 1.0, "b": 1.0, "c": 1.0}).items()}
    assert {h.batch_size for h in report_round(server.stub, threads, ids, 0).values()} == {16}
    stub = server.stub()
    stub.Leave(ps_pb2.LeaveRequest(worker_id=ids["c"], secret=SECRETS[ids["c"]]), timeout=TIMEOUT)
    del ids["c"]
    expect_refused(server, lambda: call(stub, report(ids["a"], 1, batch=24)), Code.FAILED_PRECONDITION,
                   "batch size 24 is not what this server planned for worker a at round 1 (told: 16)")
    first = {n: threads.submit(call, server.stub(), report(w, 1, batch=16)) for n, w in ids.items()}
    assert {f.result(TIMEOUT).batch_size for f in first.values()} == {24}  # told for round 2
    for batch in (20, 32):
        expect_refused(server, lambda batch=batch: call(stub, report(ids["a"], 2, batch=batch)), Code.FAILED_PRECONDITION,
                       f"batch size {batch} is not what this server planned", "told: 16, 24")
    lagged = {n: threads.submit(call, server.stub(), report(w, 2, batch=16)) for n, w in ids.items()}  # drawn before
    assert {f.result(TIMEOUT).round for f in lagged.values()} == {3}
    expect_refused(server, lambda: call(stub, report(ids["a"], 3, batch=16)), Code.FAILED_PRECONDITION, "told: 24")


def test_leave_starts_a_new_generation(ps_server, threads) -> None:
    server = ps_server(*TINY)
    ids = {n: j.worker_id for n, j in join_all(server, threads, {"a": 1.0, "b": 1.0}).items()}
    h = report_then_leave(server, threads, ids, "a", "b")  # the round closed with a alone
    assert (h.round, h.generation, h.rank, h.world_size, h.batch_size, h.global_batch) == (1, 2, 0, 1, 32, 32)


def test_a_leave_after_a_report_closes_the_round_without_the_others(ps_server, threads, tmp_path: Path) -> None:
    """a's report says the group's all-reduce of round 0 succeeded. When c leaves, b may be the rank
    whose all-reduce failed part way (c gone before the hub's send to b): it waits for the next
    generation and would wait there for a, which waits for b's report. The round closes instead; b
    forms the next generation at round 1, and a report of round 0 that b still sends is refused."""
    server = ps_server(*TINY, "--workers", "3", "--global-batch", "48", "--metrics-log", str(tmp_path / "metrics.jsonl"))  # 16 each
    ids = {n: j.worker_id for n, j in join_all(server, threads, {"a": 1.0, "b": 1.0, "c": 1.0}).items()}
    h = report_then_leave(server, threads, ids, "a", "c")
    stub = server.stub()
    assert (h.round, h.generation, h.world_size) == (1, 2, 2)
    (b_plan,) = stub.Pull(ps_pb2.PullRequest(worker_id=ids["b"], secret=SECRETS[ids["b"]], header_only=True), timeout=TIMEOUT)
    assert (b_plan.header.round, b_plan.header.generation, {h.rank, b_plan.header.rank}) == (1, 2, {0, 1})
    expect_refused(server, lambda: call(stub, report(ids["b"], 0)), Code.FAILED_PRECONDITION, "round 0 is not open")
    assert server.call(lambda: server.coordinator.samples) == 16  # a's step, counted once
    (closed,) = [e for e in read_metrics(tmp_path / "metrics.jsonl") if e["event"] == "close_without"]
    assert (closed["round"], closed["workers"]) == (0, ["b"])


def test_a_report_from_a_replaced_generation_closes_the_round(ps_server, threads, tmp_path: Path) -> None:
    """The same failure with the leave first (seen in CI: the leaver's Leave beat a's report): c
    leaves, then a reports round 0 from generation 1, whose all-reduce gave it the sum. Generation 2
    exists by then, and b (without the sum) waits there for a, so a's report closes the round at once.
    A report from the current generation still waits for everyone."""
    server = ps_server(*TINY, "--workers", "3", "--global-batch", "48", "--metrics-log", str(tmp_path / "metrics.jsonl"))  # 16 each
    ids = {n: j.worker_id for n, j in join_all(server, threads, {"a": 1.0, "b": 1.0, "c": 1.0}).items()}
    stub = server.stub()
    stub.Leave(ps_pb2.LeaveRequest(worker_id=ids["c"], secret=SECRETS[ids["c"]]), timeout=TIMEOUT)
    h = call(stub, report(ids["a"], 0, generation=1))
    assert (h.round, h.generation, h.world_size) == (1, 2, 2)
    expect_refused(server, lambda: call(stub, report(ids["b"], 0, generation=2)), Code.FAILED_PRECONDITION,
                   "round 0 is not open")
    (closed,) = [e for e in read_metrics(tmp_path / "metrics.jsonl") if e["event"] == "close_without"]
    assert (closed["round"], closed["workers"]) == (0, ["b"])
    pending = threads.submit(call, server.stub(), report(ids["a"], 1, generation=2))
    time.sleep(0.3)
    assert not pending.done()  # the current generation's report waits for b's
    h = call(stub, report(ids["b"], 1, generation=2))
    assert h.round == pending.result(TIMEOUT).round == 2


# ------------------------------------------------------------- the command line
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--mode", "asp", "--allreduce"], "--allreduce is the BSP collective fast path; it cannot run with --mode asp"),
        (["--allreduce", "off", "--rendezvous-port", "29500"], "--rendezvous-port needs --allreduce (on, or auto"),
        (["--mode", "asp", "--rendezvous-port", "29500"], "--rendezvous-port needs --allreduce (on, or auto"),
        (["--allreduce", "--rendezvous-port", "70000"], "argument --rendezvous-port: expected a port in 0-65535, got '70000'"),
        (["--rendezvous-port", "70000"], "argument --rendezvous-port: expected a port in 0-65535, got '70000'"),
        (["--allreduce", "off", "--allreduce-algorithm", "hub"], "--allreduce-algorithm needs --allreduce (on, or auto"),
        # auto cannot take the fast path where busy time or the cycle is asked for, or with shards
        (["--balance", "busy", "--allreduce-algorithm", "hub"], "--allreduce-algorithm needs --allreduce (on, or auto"),
        (["--shards", "2", "--rendezvous-port", "29500"], "--rendezvous-port needs --allreduce (on, or auto"),
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


# ------------------------------------------------------------ real processes
JOB = ["--model-arg", "hidden=16", "--dataset", "digits", "--controller", "uniform", "--evict-after", "60", "--grace", "5"]


def _finish(cluster: Cluster, timeout: float, killed: subprocess.Popen | None = None) -> None:
    code = cluster.wait(timeout)
    assert code == 0, cluster.server_log()
    for i, proc in enumerate(cluster.workers):
        assert proc.returncode == (-signal.SIGKILL if proc is killed else 0), cluster.worker_log(f"w{i}")


def _train_in_process(target: str, name: str) -> int:
    with connect(target, name=name, cores=1.0) as session:
        train(session, quiet=True)
        return session.steps


# two workers, two epochs of 45 steps in all (digits' training samples at a global batch of 64)
EQUAL_JOB = [*JOB, "--workers", "2", "--global-batch", "64", "--epochs", "2", "--lr-milestones", "1",
             "--momentum", "0.9", "--nesterov", "--weight-decay", "1e-4"]


def _run_both(ps_server, threads, workdir: Path, ar_dir: Path, ps_dir: Path, resume: bool = False) -> tuple[Cluster, int]:
    """EQUAL_JOB on the fast path (a real server and two worker processes on gloo, checkpoints in
    `ar_dir`) and on the PS path (an in-process server and two in-process workers, checkpoints in
    `ps_dir`), each resumed from its directory if `resume`; returns the finished fast-path cluster
    and the steps each PS-path worker took."""
    workdir.mkdir()
    flags = {d: ["--checkpoint-dir", str(d), *(["--resume", str(d)] if resume else [])] for d in (ar_dir, ps_dir)}
    cluster = start_server(workdir, [*EQUAL_JOB, "--allreduce", *flags[ar_dir]])
    try:
        for i in range(2):
            cluster.start_worker(f"w{i}", "--device", "cpu")  # as the in-process PS-path workers compute
        server = ps_server(*EQUAL_JOB, *flags[ps_dir])
        steps = [threads.submit(_train_in_process, server.target, f"w{i}") for i in range(2)]
        (taken,) = {f.result(120) for f in steps}
        server.job.checkpointer.flush()
        server.call(server.job.final_checkpoint)
        _finish(cluster, 120)
    finally:
        cluster.stop()
    return cluster, taken


def _assert_same_checkpoints(ps_dir: Path, ar_dir: Path, count: int) -> None:
    """Same rounds, parameters and momentum (to 1e-5) in the two directories' checkpoints."""
    ps, ar = ({p.name: read_checkpoint(p) for p in checkpoint_files(d)} for d in (ps_dir, ar_dir))
    assert ps.keys() == ar.keys() and len(ps) == count
    for name in ps:
        assert (ps[name]["round"], ps[name]["samples"]) == (ar[name]["round"], ar[name]["samples"])
        torch.testing.assert_close(ar[name]["params"], ps[name]["params"], rtol=0, atol=1e-5)
        momentum = [c["optimizer"]["state"][0]["momentum_buffer"] for c in (ar[name], ps[name])]
        assert momentum[1].abs().max() > 1e-3  # the PS path's has grown: a real comparison
        torch.testing.assert_close(*momentum, rtol=0, atol=1e-5)


def test_fast_path_equals_the_ps_path(ps_server, threads, tmp_path: Path) -> None:
    """Same seeds, same batches: after every epoch the fast path's server checkpoint (real processes,
    gloo) matches the PS path's (an in-process server and two in-process workers) to 1e-5, momentum
    included (rank 0's snapshot carries it). Resumed from the fast path's checkpoint after epoch 1,
    the last epoch again ends the same on both paths: the fast path's workers start from the
    checkpoint's momentum as the PS path's server does."""
    cluster, steps = _run_both(ps_server, threads, tmp_path / "first", tmp_path / "allreduce", tmp_path / "ps")
    assert steps == 45
    _assert_same_checkpoints(tmp_path / "ps", tmp_path / "allreduce", 2)  # after epoch 1 and at the end
    assert [e["world_size"] for e in cluster.events("regroup")] == [2]
    assert len(cluster.events("snapshot")) == 2 and len(cluster.events("eval")) == 2

    after_epoch_1 = checkpoint_files(tmp_path / "allreduce")[0]
    for resumed in ("resumed-ps", "resumed-allreduce"):
        (tmp_path / resumed).mkdir()
        shutil.copy(after_epoch_1, tmp_path / resumed / after_epoch_1.name)
    cluster, steps = _run_both(ps_server, threads, tmp_path / "second", tmp_path / "resumed-allreduce",
                               tmp_path / "resumed-ps", resume=True)
    assert steps == 45 - read_checkpoint(after_epoch_1)["round"] and [e["epoch"] for e in cluster.events("resume")] == [1]
    _assert_same_checkpoints(tmp_path / "resumed-ps", tmp_path / "resumed-allreduce", 2)


def test_a_step_reads_its_reports_reply_at_the_next_step(ps_server) -> None:
    """The fast path sends a step's report and returns with the new parameters without reading the
    reply; the next step reads it before its all-reduce, so the server's round close overlaps the next
    computation. The batch after the job's end is dropped: steps count the rounds taken."""
    server = ps_server(*TINY, "--workers", "1")
    with connect(server.target, name="w0", cores=1.0) as session:
        read: list[bool] = []
        start_push = session.client.start_push

        def recording_start_push(*args: object, **kwargs: object):
            reply = start_push(*args, **kwargs)
            if kwargs["kind"] != "report":  # rank 0's snapshots go through push(), read at once
                return reply
            index = len(read)
            read.append(False)

            def wait():
                read[index] = True
                return reply()

            return wait

        session.client.start_push = recording_start_push
        batches = session.batches()
        for expected in ([False], [True, False]):
            x, y = next(batches)
            session.model.zero_grad()
            torch.nn.functional.cross_entropy(session.model(x), y).backward()
            session.step()
            assert read == expected
            assert torch.equal(flatten_params(session.model), session._collective.params)  # the new parameters
        train(session, quiet=True)
        assert all(read) and session.done
        assert session.steps == len(read) == server.call(lambda: server.coordinator.round)


def _round(target: str) -> int:
    client = PSClient(target)
    try:
        return client.status().round
    except ServerError:
        return -1
    finally:
        client.close()


@pytest.mark.parametrize(("sig", "event"), [(signal.SIGTERM, "leave"), (signal.SIGKILL, "evict")])
def test_group_reforms_when_a_worker_leaves(tmp_path: Path, sig: signal.Signals, event: str) -> None:
    """SIGTERM one of three workers mid-run (while the others wait in the all-reduce), or SIGKILL it
    (no Leave: its peers' all-reduce fails and the server evicts it): the other two re-form a group of
    two and finish the job."""
    cluster = start_server(tmp_path, [*JOB, "--allreduce", "--workers", "3", "--global-batch", "48", "--epochs", "3",
                                      "--checkpoint-dir", str(tmp_path / "ckpt"), "--evict-after", "3"])
    try:
        cluster.start_worker("w0")
        cluster.start_worker("w1")
        victim = cluster.start_worker("w2", "--slowdown", "4")  # the others often wait for it inside the all-reduce
        deadline = time.monotonic() + 120  # process start-up is slow on a busy machine
        while _round(cluster.target) < 3:
            assert time.monotonic() < deadline and cluster.server.poll() is None, cluster.server_log()
            time.sleep(0.05)
        victim.send_signal(sig)
        _finish(cluster, 120, killed=victim if sig == signal.SIGKILL else None)
        events = cluster.events()
        kinds = [e["event"] for e in events]
        left = kinds.index(event)
        assert events[left]["worker"] == "w2"
        regroup = next(e for e in events[left:] if e["event"] == "regroup")
        assert regroup["world_size"] == 2 and set(regroup["ranks"]) == {"w0", "w1"}
        (summary,) = cluster.events("summary")
        assert summary["epochs"] == 3 and summary["reason"] == "finished"
        assert [e["epoch"] for e in cluster.events("eval")] == [1, 2, 3]
        for name in ("w0", "w1"):  # a round the leave closed before a survivor's report is not its update
            missed = sum(name in e["workers"] for e in cluster.events("close_without"))
            assert summary["update_counts"][name] == summary["rounds"] - missed
        assert sum(cluster.events("adjust")[-1]["batch_sizes"].values()) == 48
        final = read_checkpoint(checkpoint_files(tmp_path / "ckpt")[-1])
        assert final["round"] == summary["rounds"] and bool(torch.isfinite(final["params"]).all())
        assert summary["accuracy"] > 0.5, summary
    finally:
        cluster.stop()

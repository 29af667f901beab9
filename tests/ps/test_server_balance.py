"""`ps-server --balance`: what a worker reports as its step time (in-process server, in-process worker);
the spec fields a resume may change."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import pytest
import torch
import torch.nn.functional as F

from common.job.spec import JobSpec, default_balance
from ps.rounds.checkpoint_state import describe_resume_changes, resume_changes
from ps.server_job import build_job
from tests.conftest import job_args
from tests.hostile_peer import wait_until
from tests.rpc_calls import header, join_all, push, push_chunks
from worker import connect

if TYPE_CHECKING:
    from tests.conftest import InProcessServer


def _steps(server: InProcessServer, steps: int) -> tuple[list[float], list[float]]:
    """Take `steps` BSP steps with one worker; the compute times it measured and those the server got."""
    measured: list[float] = []
    with connect(server.target, name="w0", cores=1.0) as session:
        for x, y in session.batches():
            loss = F.cross_entropy(session.model(x), y)
            session.model.zero_grad(set_to_none=False)
            loss.backward()
            session.step()
            measured.append(session.last_compute_ms)
            if len(measured) == steps:
                break
        received = server.call(lambda: [list(m.epoch_compute_ms) for m in server.coordinator.members.values()])
    assert len(received) == 1
    return measured, received[0]


@pytest.mark.parametrize("balance", ["compute", "busy"])
def test_busy_time_adds_the_previous_push_and_compute_does_not(ps_server, balance: str) -> None:
    # one worker, a global batch of 8: 3 steps stay inside the first epoch (1438 training samples)
    server = ps_server("--workers", "1", "--global-batch", "8", "--balance", balance)
    measured, received = _steps(server, 3)
    assert len(received) == 3
    assert received[0] == pytest.approx(measured[0], abs=1e-3)  # no push before the first
    for ours, theirs in zip(measured[1:], received[1:], strict=True):
        if balance == "compute":
            assert theirs == pytest.approx(ours, abs=1e-3)
        else:  # sending 3 KB and loading the reply take well under a second here
            assert ours < theirs < ours + 1000.0


def test_balance_is_checked() -> None:
    with pytest.raises(ValueError, match="balance must be one of"):
        JobSpec(balance="wall")
    with pytest.raises(SystemExit):
        job_args("--balance", "wall")
    assert build_job(job_args("--balance", "busy")).coordinator.spec.balance == "busy"
    # the spec itself refuses what the server's flags refuse (a spec also comes from JSON and the API)
    assert JobSpec(balance="busy", allreduce=True).balance == "busy"  # the fast path's own part is CPU time
    for fields in ({"mode": "asp"}, {"allreduce": True}):
        with pytest.raises(ValueError, match="balance cycle is timed in BSP rounds"):
            JobSpec(balance="cycle", **fields)
    assert JobSpec(balance="cycle").balance == "cycle"


@pytest.mark.parametrize("flags", [["--shards", "2"], ["--shard-addresses", "127.0.0.1:1"]])
def test_busy_time_is_refused_where_it_is_not_measured(flags: list[str]) -> None:
    """A sharded push records no timing: refused at start rather than silently balancing compute time."""
    with pytest.raises(ValueError, match="--balance busy is measured with one server only"):
        build_job(job_args("--balance", "busy", *flags))


def test_the_fast_path_balances_busy_time_by_default() -> None:
    """BSP on the fast path balances busy time too (its own part from CPU time: worker/timing/own_time.py)."""
    assert build_job(job_args("--allreduce")).coordinator.spec.balance == "busy"
    assert build_job(job_args("--allreduce", "--balance", "busy")).coordinator.spec.balance == "busy"


@pytest.mark.parametrize("flags", [["--mode", "asp"], ["--allreduce"], ["--shards", "2"]])
def test_the_cycle_is_refused_where_it_is_not_measured(flags: list[str]) -> None:
    """ASP has no rounds; a report arrives after the all-reduce (which waits for the slowest peer);
    the coordinator sees one range of a sharded push."""
    with pytest.raises(ValueError, match="--balance cycle is measured in BSP rounds on the PS path"):
        build_job(job_args("--balance", "cycle", *flags))


def test_the_cycle_is_timed_by_the_server_from_the_replies_to_each_push(ps_server, threads) -> None:
    """Under --balance cycle the controller gets the server's clock, from the round's replies going
    out to each worker's next push arrived, whatever compute time the worker reports; the first round
    (which began with a Join, not a reply) is not observed."""
    server = ps_server("--workers", "2", "--global-batch", "32", "--balance", "cycle", "--controller", "uniform")
    now = [1000.0]
    server.call(lambda: setattr(server.coordinator, "clock", lambda: now[0]))
    joined = join_all(server, threads, {"a": 1.0, "b": 1.0})
    numel = joined["a"].num_params

    def push_from(name: str, round: int) -> None:
        values = torch.zeros(numel)
        chunks = push_chunks(header(joined[name].worker_id, values, round=round, batch_size=16, compute_ms=5.0), values)
        threads.submit(push, server.stub(), chunks)

    def wait_pushed(count: int) -> None:
        wait_until(lambda: server.call(lambda: len(server.coordinator.bsp.pushed)) == count, f"{count} pushes")

    def wait_round(round: int) -> None:
        wait_until(lambda: server.call(lambda: server.coordinator.round) == round, f"round {round}")

    push_from("a", 0)
    push_from("b", 0)
    wait_round(1)  # the replies went out at 1000.0
    assert server.call(lambda: server.coordinator.policy.smoothed_ms()) == {"a": None, "b": None}
    now[0] = 1000.1
    push_from("a", 1)
    wait_pushed(1)
    now[0] = 1000.3
    push_from("b", 1)
    wait_round(2)
    smoothed = server.call(lambda: server.coordinator.policy.smoothed_ms())
    assert smoothed == {"a": pytest.approx(100.0), "b": pytest.approx(300.0)}
    epoch_ms = server.call(lambda: {m.name: list(m.epoch_compute_ms) for m in server.coordinator.members.values()})
    assert epoch_ms == {"a": [pytest.approx(100.0)], "b": [pytest.approx(300.0)]}  # what the epoch line shows


@pytest.mark.parametrize(
    ("mode", "shards", "expected"), [("bsp", 1, "busy"), ("asp", 1, "compute"), ("bsp", 2, "compute")],
)
def test_auto_balances_busy_time_for_bsp_on_one_server(mode: str, shards: int, expected: str) -> None:
    """The default (auto): busy time where it is measured and was faster (BSP, one server, on either
    path); compute time in ASP (busy time was slower there) and with --shards."""
    assert default_balance(mode, shards) == expected


@pytest.mark.parametrize(
    ("flags", "expected"),
    [([], "busy"), (["--mode", "asp"], "compute"), (["--balance", "compute"], "compute"),
     (["--mode", "asp", "--balance", "busy"], "busy")],
)
def test_the_server_resolves_auto_into_the_job_spec(flags: list[str], expected: str) -> None:
    """Workers read the resolved choice from the job spec; an explicit --balance wins."""
    job = build_job(job_args(*flags))
    try:
        assert job.coordinator.spec.balance == expected
    finally:
        job.evaluator.close()
        job.metrics.close()


def test_a_checkpoint_resumes_with_another_balance_but_not_as_another_job() -> None:
    """What the controller balances is policy, not the job's math: a checkpoint written under
    --balance compute (the old default) resumes under auto; one with another learning rate does not."""
    jobs = [build_job(job_args(*flags)) for flags in (["--balance", "compute"], [], ["--lr", "0.5"])]
    try:
        state = jobs[0].coordinator.checkpoint_state()
        jobs[1].coordinator.restore(state)
        assert jobs[1].coordinator.spec.balance == "busy"
        with pytest.raises(ValueError, match="written for a different job: --lr differs"):
            jobs[2].coordinator.restore(state)
    finally:
        for job in jobs:
            job.evaluator.close()
            job.metrics.close()


def test_the_spec_asks_for_gradient_norms_with_adaptive_batch_only() -> None:
    """The fast path's workers measure |g_k|² and |g|² for --adaptive-batch; a checkpoint written
    without it resumes with it (a server flag), and one that predates the field resumes too."""
    jobs = [build_job(job_args(*flags)) for flags in ([], ["--adaptive-batch", "gns"])]
    try:
        assert [job.coordinator.spec.gradient_norms for job in jobs] == [False, True]
        state = jobs[0].coordinator.checkpoint_state()
        jobs[1].coordinator.restore(state)
        older = json.loads(state["spec"])
        del older["gradient_norms"]
        jobs[1].coordinator.restore({**state, "spec": json.dumps(older)})
        assert resume_changes({**state, "spec": json.dumps(older)}, jobs[0].coordinator.spec) == {
            "gradient_norms": (None, False)}
        assert describe_resume_changes({"gradient_norms": (None, False)}) == "--adaptive-batch unset -> off"
        # overlap False is --no-overlap on: the line says the flag as it was given
        assert describe_resume_changes({"overlap": (False, True)}) == "--no-overlap on -> off"
    finally:
        for job in jobs:
            job.evaluator.close()
            job.metrics.close()


def test_the_server_refuses_a_model_out_of_range_or_beyond_its_memory_before_building_it() -> None:
    """The server's own build of the job checks what a worker's does: ranges, then the estimated size."""
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"layers must be in \[0, 64\], got 3000000"):
        build_job(job_args("--model-arg", "layers=3000000"))
    with pytest.raises(ValueError, match=r"model 'mlp' with options \{'hidden': 16384, 'layers': 64\} .* needs about .* GiB"):
        build_job(job_args("--model-arg", "hidden=16384", "--model-arg", "layers=64"))
    assert time.monotonic() - start < 10

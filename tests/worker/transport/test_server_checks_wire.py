"""What a worker takes from its server, over the wire: the worker's own code in this process (connect(),
its Session) against a server written from protos/ alone (tests/hostile_server.py) that answers a
reply the worker must refuse. Each refusal is one line naming what the server sent, the worker leaves
and pushes nothing; a parked worker's long poll that the server answers at once is not a busy loop,
nor an ASP worker's local steps that all overflow at its server's learning rate."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from protos import ps_pb2
from tests.hostile_server import GOOD_SPEC, LAYOUT, NUMEL, Scenario, serving
from worker.training_loop import NonFiniteLoss, train
from worker.connection import connect
from worker.data.slices import BadSlice
from worker.runtime import Session
from worker.transport.call_bounds import MIN_PARKED_POLL_S
from worker.transport.server_checks import MAX_REFUSED_STEPS, UntrustedReply
from worker.transport.server_error import ServerError


def joined(target: str, max_batch: int = 16) -> Session:
    """A session of this process's worker at `target`: its memory bound given (no probe), torch's threads untouched."""
    return connect(target, name="w", timeout=5.0, retry_for=0.0, max_batch=max_batch, threads=None)


def refused(scenario: Scenario, error: type[Exception], said: str, max_batch: int = 16) -> list[str]:
    """The worker's refusal of `scenario`, checked to say `said`; the calls the server got."""
    with serving(scenario) as (fake, target):
        with pytest.raises(error, match=re.escape(said)) as raised:
            joined(target, max_batch).close()
    assert "\n" not in str(raised.value)
    assert "Leave" in fake.calls and "Push" not in fake.calls, fake.calls
    return fake.calls


@pytest.mark.parametrize(("join", "said"), [
    ({"worker_id": ""}, "the server's worker id '' is not 1 to 256 printable characters"),
    ({"secret": ""}, "the server's secret ''"),
    ({"worker_id": "w\x1b[2J\nps-worker: error: forged"}, "the server's worker id 'w\\x1b[2J\\nps-worker"),
    ({"worker_id": "w" * 100_000}, "is not 1 to 256 printable characters"),
    ({"index": -5}, "negative round, version, epoch or join order (0, 0, 0, -5)"),
    ({"round": -3}, "negative round"),
    ({"layout": [ps_pb2.TensorSpec(name="1.weight", shape=[-1, 64], dtype="float32")]}, "shape [-1, 64]"),
    ({"layout": []}, "the server's layout holds no values"),
    ({"world_size": 2, "backend": "mpi"}, "the server's group backend 'mpi' is not one of gloo, nccl"),
    ({"world_size": 2, "backend": "gloo", "rank": 2}, "the server's group rank 2 is neither -1 (not in the generation "
                                                      "yet) nor inside its size 2"),
    ({"world_size": 2, "backend": "gloo", "rank": -2}, "the server's group rank -2 is neither -1"),
], ids=["empty-id", "empty-secret", "control-characters", "huge-id", "negative-index", "negative-round",
        "negative-dimension", "no-layout", "unknown-backend", "rank-past-the-group", "rank-below--1"])
def test_a_join_reply_the_worker_cannot_be_is_refused_before_it_pulls(join: dict[str, Any], said: str) -> None:
    calls = refused(Scenario(join=join), UntrustedReply, said)
    assert "Pull" not in calls


@pytest.mark.parametrize("num_params", [NUMEL + 1, 0], ids=["one-more", "none"])
def test_a_join_reply_whose_num_params_is_not_its_layouts_is_refused_naming_both(num_params: int) -> None:
    """The layout is the model the worker builds (the test below): a size that disagrees with it says
    two models, and the worker acts on neither."""
    calls = refused(Scenario(join={"num_params": num_params}), UntrustedReply,
                    f"the server's Join reply says num_params {num_params}, where its layout holds {NUMEL} values")
    assert "Pull" not in calls


@pytest.mark.parametrize("address", ["127.0.0.1:", "127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1", "127.0.0.1:1,2",
                                     "::1:7001", "[::1:7001"],
                         ids=["no-port", "port-past-65535", "port-0", "no-colon", "two-ports", "ipv6-unbracketed",
                              "bracket-unclosed"])
def test_a_shard_address_that_is_not_host_port_is_refused_before_it_is_reached(address: str) -> None:
    """gRPC reads "127.0.0.1:" as port 443 and 99999 as 34463: the worker would have sent its secret
    to a port the server never named."""
    calls = refused(Scenario(shards=[(address, 1000, NUMEL)], values=[0.0] * 1000), UntrustedReply,
                    f"the server's shard address {address!r} is not HOST:PORT with a port in [1, 65535] (")
    assert "Pull" not in calls


def test_a_layout_of_another_model_is_refused_naming_where_it_differs() -> None:
    layout = [ps_pb2.TensorSpec(name=n, shape=list(reversed(shape)), dtype="float32") for n, shape in LAYOUT]
    refused(Scenario(join={"layout": layout}), ServerError, "does not match the server's parameter layout: tensor 0 "
            "is '1.weight' [64, 16] float32 there, '1.weight' [16, 64] float32 here")


def test_an_asp_learning_rate_above_the_jobs_is_refused_not_dropped_batch_after_batch() -> None:
    """A finite rate whose every local step would overflow fp32 had the worker drop each batch and
    pull again, for ever."""
    refused(Scenario(spec={**GOOD_SPEC, "mode": "asp"}, pull={"lr": 1e300}), UntrustedReply,
            "the server's learning rate 1e+300 is above the job's 0.1 at epoch 0")


def test_a_fast_path_learning_rate_above_the_jobs_is_refused_before_the_group_steps_at_it() -> None:
    """The group steps its own copy at the plan's rate: at most the schedule's times max(1, B / B0), B
    at most digits' 1,438 training samples and B0 the spec's 16."""
    group = {"generation": 1, "rank": 0, "world_size": 1, "backend": "gloo"}
    refused(Scenario(spec={**GOOD_SPEC, "allreduce": True}, join=group, pull={**group, "hub_rank": 0, "lr": 1e30}), UntrustedReply,
            "the server's learning rate 1e+30 for its group is above the job's 8.9875 at epoch 0 (its schedule, scaled "
            "up to a global batch of 1438)")


@pytest.mark.parametrize("epoch", [1, 2**31 - 1], ids=["the-job's-end", "far-past-it"])
def test_a_plan_past_the_jobs_last_epoch_is_refused(epoch: int) -> None:
    """A job of one epoch trains epoch 0; independent sampling hands no slice whose epochs would say so."""
    refused(Scenario(pull={"epoch": epoch}), UntrustedReply,
            f"the server's plan is at epoch {epoch}, past the job's last epoch 0")


@pytest.mark.parametrize("epoch", [1, 2**31 - 1], ids=["the-job's-end", "far-past-it"])
def test_a_join_reply_past_the_jobs_last_epoch_is_refused_before_it_pulls(epoch: int) -> None:
    """As a plan's: a server answers no Join once its job has ended, and a job of one epoch trains epoch 0."""
    calls = refused(Scenario(join={"epoch": epoch}), UntrustedReply,
                    f"the server's Join reply is at epoch {epoch}, past the job's last epoch 0")
    assert "Pull" not in calls


def test_a_batch_above_the_training_set_is_refused() -> None:
    """digits trains on 1,438 samples: a batch of 2,000 would train some of them twice in one step."""
    big = Scenario(spec={**GOOD_SPEC, "global_batch": 2000}, pull={"batch_size": 2000, "global_batch": 2000})
    refused(big, UntrustedReply, "the server planned a batch of 2000, above the training set's 1438 samples", max_batch=4096)


@pytest.mark.parametrize("slices", [
    [(0, 0, 4), (0, 2, 4)],  # [0, 4) and [2, 6): samples 2 and 3 twice
    [(0, 0, 8), (0, 0, 8, "ahead")],
], ids=["within-the-slice", "slice-and-slice-ahead"])
def test_samples_handed_twice_in_an_epoch_are_refused(slices: list[tuple[Any, ...]]) -> None:
    pull: dict[str, list[ps_pb2.SliceRange]] = {"slice": [], "next_slice": []}
    for epoch, offset, count, *ahead in slices:
        pull["next_slice" if ahead else "slice"].append(ps_pb2.SliceRange(epoch=epoch, offset=offset, count=count))
    refused(Scenario(spec={**GOOD_SPEC, "sampling": "exact"}, pull=pull), BadSlice, "the server handed samples of epoch 0 twice")


@pytest.mark.parametrize(("scenario", "said"), [
    (Scenario(pull={"optimizer_state": True}), "the server's reply says it carries the optimizer's state, where this "
                                               "worker asked for parameters"),
    (Scenario(values=[]), "the server's reply carries no values, where this worker asked for its parameters"),
    (Scenario(header_on="data"), "the server's reply starts without its header"),
    (Scenario(header_on="both"), "the server's reply carries a second header, on chunk 1"),
], ids=["optimizer-state-for-parameters", "header-alone", "no-header", "second-header"])
def test_a_reply_that_is_not_the_parameters_with_one_header_is_refused(scenario: Scenario, said: str) -> None:
    refused(scenario, UntrustedReply, said)


@pytest.mark.parametrize("overlap", [False, True], ids=["whole-push", "buckets-streamed"])
def test_a_push_reply_without_parameters_on_the_ps_path_is_refused(overlap: bool) -> None:
    """On the PS path the server steps and the worker trains on what it sends back: a header alone
    (not ending the job) would have it train its next batch on the parameters of a step before. The
    fast path's reports and snapshots take headers alone (--allreduce auto's switch back)."""
    bare = Scenario(spec={**GOOD_SPEC, "overlap": overlap}, pushes=3, push_values=[])
    with serving(bare) as (fake, target):
        with joined(target) as session, pytest.raises(UntrustedReply, match=re.escape(
                "the server's reply carries no values, where this worker asked for its parameters")):
            train(session, quiet=True)
    assert fake.calls.count("Push") == 1 and "Leave" in fake.calls


def test_a_probe_reply_without_parameters_on_the_ps_path_is_followed_by_a_pull_of_them() -> None:
    """A probe is answered once the worker is in the plan, rounds after the parameters it pulled at its
    join: a header alone, not on the fast path (no group named), would have it train its first planned
    step on those. Our server sends one on the PS path too (--allreduce auto's switch back, until a
    snapshot came), so the worker pulls the parameters instead of leaving."""
    bare = Scenario(pull={"probe": True}, pushes=2, push_values=[])
    with serving(bare) as (fake, target):
        with joined(target) as session:
            train(session, quiet=True)
    assert [c for c in fake.calls if c in ("Pull", "Push")] == ["Pull", "Push", "Pull", "Push"], fake.calls
    assert "Leave" not in fake.calls


SHARD_FROM = 1000  # the fake server holds values [0, 1000), its shard the rest


def test_a_job_with_a_good_shard_runs_to_its_end() -> None:
    with serving(Scenario(shard_from=SHARD_FROM, pushes=2)) as (fake, target):
        with joined(target) as session:
            train(session, quiet=True)
    assert fake.calls.count("Shard-Push") == 2 and "Leave" not in fake.calls, fake.calls


@pytest.mark.parametrize(("shard", "values", "said"), [
    ({"done": True, "reason": "finished"}, [], "a shard server's reply carries no values (a shard ends no job; "
                                              "the server's reply does)"),
    ({}, [], "the server's reply carries no values, where this worker asked for its parameters"),
    ({}, [0.0] * (NUMEL - SHARD_FROM - 1), f"the layout expects {NUMEL - SHARD_FROM}"),
    ({}, [float("inf")] * (NUMEL - SHARD_FROM), "the server's parameters hold NaN or Inf values"),
    ({"optimizer_state": True}, None, "says it carries the optimizer's state, where this worker asked for parameters"),
], ids=["done-without-values", "header-alone", "short", "infinite", "optimizer-state"])
def test_a_shard_reply_that_is_not_its_range_is_refused(shard: dict[str, Any], values: list[float] | None,
                                                        said: str) -> None:
    """The worker pulls every range at its join: a shard's reply fills its range exactly, with finite
    parameters; it never ends the job (its header's done is no reason to send nothing)."""
    calls = refused(Scenario(shard_from=SHARD_FROM, shard=shard, shard_values=values), UntrustedReply, said)
    assert "Shard-Pull" in calls


@pytest.mark.parametrize("overlap", [False, True], ids=["whole-push", "buckets-streamed"])
def test_a_shard_push_reply_that_says_done_without_values_is_refused(overlap: bool) -> None:
    """A push's reply from a shard, gathered whole or streamed into the next forward: its range comes
    whatever its header says (the server's reply, not the shard's, ends the job)."""
    bare = Scenario(spec={**GOOD_SPEC, "overlap": overlap}, shard_from=SHARD_FROM, pushes=3,
                    shard_push={"done": True, "reason": "finished"}, shard_push_values=[])
    with serving(bare) as (fake, target):
        with joined(target) as session, pytest.raises(UntrustedReply, match=re.escape(
                "a shard server's reply carries no values (a shard ends no job; the server's reply does)")):
            train(session, quiet=True)
    # streamed, the next step's buckets may already be on their way when the reply is found bare: that
    # push reaches the servers too (the fake hears its call start, at times after the Leave), no later one
    pushed = {fake.calls.count("Shard-Push"), fake.calls.count("Push")}
    assert pushed <= ({1, 2} if overlap else {1}) and "Leave" in fake.calls, fake.calls


def test_a_long_poll_answered_at_once_is_asked_again_no_sooner_than_the_floor() -> None:
    with serving(Scenario(join={"batch_size": 0}, pull={"batch_size": 0})) as (fake, target):
        session = joined(target)
        try:
            start = time.monotonic()
            for _ in range(3):
                assert session.wait_parked().batch_size == 0
            took = time.monotonic() - start
        finally:
            session.close()
    assert took >= 3 * MIN_PARKED_POLL_S * 0.95, took
    assert fake.calls.count("Pull") == 4  # the parameters at join, then one poll a wait


def test_an_asp_worker_whose_every_local_step_overflows_leaves_after_a_few() -> None:
    """The spec's own learning rate can be one no local step survives: the worker drops a few such
    batches, then leaves, instead of dropping and pulling for ever."""
    asp = {**GOOD_SPEC, "mode": "asp", "lr": 1e300}
    with serving(Scenario(spec=asp, pull={"lr": 1e300})) as (fake, target):
        with joined(target) as session, pytest.raises(UntrustedReply, match=re.escape(
                f"{MAX_REFUSED_STEPS} local steps in a row could overflow fp32 at the server's learning rate 1e+300")):
            train(session, quiet=True)
    assert "Push" not in fake.calls and "Leave" in fake.calls
    assert fake.calls.count("Pull") == MAX_REFUSED_STEPS  # the first, then one after each batch dropped but the last


def test_finite_parameters_no_forward_survives_are_named_as_the_servers_not_the_samples() -> None:
    """3e38 is a finite fp32 value, and as finite as what a diverging learning rate makes (past 1e33 in
    tests/e2e/test_worker_lifecycle.py's): the forward's loss is NaN on finite samples, and the line
    names the server's parameters and their size."""
    huge = Scenario(values=[3e38] * NUMEL)
    with serving(huge) as (fake, target):
        with joined(target) as session, pytest.raises(NonFiniteLoss, match=re.escape(
                "on finite samples, from the server's parameters as it sent them (the largest |value| 3e+38)")) as raised:
            train(session, quiet=True)
    assert "a sample holds" not in str(raised.value) and "\n" not in str(raised.value)
    assert "Push" not in fake.calls and "Leave" in fake.calls


def test_parameters_refused_while_they_streamed_into_a_forward_are_the_error_not_its_loss() -> None:
    """BSP with buckets: a push's reply streams its values into the model while the next forward
    runs; NaN among them makes that forward's loss NaN, and the line names the reply, not the loss."""
    nan = Scenario(spec={**GOOD_SPEC, "overlap": True}, pushes=3, push_values=[float("nan")] * NUMEL)
    with serving(nan) as (fake, target):
        with joined(target) as session, pytest.raises(UntrustedReply, match="the server's parameters hold NaN or Inf"):
            train(session, quiet=True)
    assert "Leave" in fake.calls

"""The refusal of a join that the global batch has no room for: what it advises under a fixed and an
adaptive global batch (the servicer's and the coordinator's tests check that a full job says it); and
the `join_refused` record a refusal of what the job cannot take writes for whoever watches the server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from common.errors import FailedPrecondition, InvalidArgument
from common.transport.messages import JoinAsk
from ps.control.config import PolicyConfig
from ps.control.global_batch.goodput import AdaptiveConfig
from ps.ops.progress import progress_line
from ps.rounds.admission import REFUSALS_LOGGED_PER_MINUTE, job_full
from ps.rounds.coordinator import Coordinator
from ps.server_job import build_job
from tests.conftest import job_args


def test_a_fixed_batch_job_is_told_the_global_batch_that_makes_room() -> None:
    message = job_full(PolicyConfig(global_batch=20, min_batch=8), None, workers=3, in_job=2, waiting=0)
    assert message == ("job full: the global batch 20 cannot give one more worker its minimum batch (2 in the job, "
                       "0 waiting); 3 workers at --min-batch 8 take a global batch of 24: raise --global-batch to 24 "
                       "or lower --min-batch")


def test_micro_batches_count_whole_in_the_global_batch_that_makes_room() -> None:
    """--min-batch 5 in micro-batches of 4 is two micro-batches, 8 samples, a worker."""
    message = job_full(PolicyConfig(global_batch=16, min_batch=5, micro_batch=4), None, workers=3, in_job=2, waiting=0)
    assert "3 workers at --min-batch 5 take a global batch of 24: raise --global-batch to 24" in message


def test_an_adaptive_batch_job_is_told_the_bounds_of_b_not_where_it_started() -> None:
    """Under --adaptive-batch, --global-batch is B's start: only the bounds that are short are named."""
    config = PolicyConfig(global_batch=16, min_batch=8)
    raised = job_full(config, AdaptiveConfig(base_batch=48, min_batch=16, max_batch=64), workers=3, in_job=2, waiting=0)
    assert raised.endswith("--adaptive-batch moves B within [--min-global-batch 16, --max-global-batch 64] "
                           "(--global-batch 48 is where it started): raise --min-global-batch to 24 or lower --min-batch")
    short = job_full(config, AdaptiveConfig(base_batch=16, min_batch=16, max_batch=20), workers=3, in_job=2, waiting=0)
    assert short.endswith("raise --min-global-batch, --global-batch, --max-global-batch to 24 or lower --min-batch")


def refusals(args: list[str], joins: Callable[[Coordinator], Coroutine[Any, Any, list[str]]]
             ) -> tuple[list[dict[str, Any]], list[str]]:
    """The `join_refused` records a job of ps-server `args` writes while `joins` runs against its
    coordinator, and what `joins` returns (the errors the workers heard)."""
    built = build_job(job_args(*args))
    records: list[dict[str, Any]] = []
    built.metrics.observe(lambda r: records.append(r) if r["event"] == "join_refused" else None)
    try:
        errors = asyncio.run(asyncio.wait_for(joins(built.coordinator), 10))
    finally:
        built.evaluator.close()
        built.metrics.close()
    assert all(progress_line(r).startswith(f"{r['worker']}: refused at join: {r['reason']}") for r in records)
    return records, errors


def test_a_join_refused_for_memory_is_logged_naming_the_worker() -> None:
    """A worker whose memory holds less than the job's smallest batch heard why at Join and exited, and
    the server said nothing and went on waiting for a worker. A `join_refused` record (and its
    progress line) names the worker and the reason the worker heard; a join that fits writes none."""
    async def joins(c: Coordinator) -> list[str]:
        with pytest.raises(FailedPrecondition) as refused:
            await c.join(JoinAsk("tiny", 1.0, max_batch=4))
        waiting = asyncio.ensure_future(c.join(JoinAsk("big", 1.0, max_batch=40)))  # waits for a second worker
        await asyncio.sleep(0)
        with pytest.raises(FailedPrecondition) as short:  # with big's 40 the pair would hold 60 < B
            await c.join(JoinAsk("small", 1.0, max_batch=20))
        waiting.cancel()
        return [str(refused.value), str(short.value)]

    records, errors = refusals(["--workers", "2", "--global-batch", "64", "--min-batch", "8"], joins)
    assert [(r["worker"], r["reason"]) for r in records] == [("tiny", errors[0]), ("small", errors[1])]
    assert "holds at most 4 samples" in errors[0] and "below --global-batch 64" in errors[1]


def test_a_join_refused_because_the_job_is_full_or_its_data_differs_is_logged_too() -> None:
    """Past --max-workers, and with a dataset whose fingerprint is not the job's, the worker heard why and
    exited while the server said nothing; a refusal of bad input (a name with a line break) writes none."""
    async def joins(c: Coordinator) -> list[str]:
        first = asyncio.ensure_future(c.join(JoinAsk("a", 1.0, dataset_fingerprint="x" * 16)))
        await asyncio.sleep(0)
        with pytest.raises(FailedPrecondition) as differs:
            await c.join(JoinAsk("b", 1.0, dataset_fingerprint="y" * 16))
        second = asyncio.ensure_future(c.join(JoinAsk("c", 1.0)))
        await asyncio.sleep(0)
        with pytest.raises(FailedPrecondition) as full:
            await c.join(JoinAsk("d", 1.0))
        with pytest.raises(InvalidArgument):
            await c.join(JoinAsk("e\nf", 1.0))
        first.cancel()
        second.cancel()
        return [str(differs.value), str(full.value)]

    records, errors = refusals(["--workers", "2", "--max-workers", "2", "--global-batch", "64"], joins)
    assert [(r["worker"], r["reason"]) for r in records] == [("b", errors[0]), ("d", errors[1])]
    assert "fingerprint" in errors[0] and "job full" in errors[1]


def test_refusals_are_logged_thirty_a_minute_at_most_and_the_rest_counted() -> None:
    """A caller that joins a full job over and over writes a record a call no longer: 30 a minute, and
    the first after the minute says how many went unlogged."""
    clock = [0.0]

    async def joins(c: Coordinator) -> list[str]:
        c.clock = lambda: clock[0]
        await c.join(JoinAsk("a", 1.0))
        for i in range(REFUSALS_LOGGED_PER_MINUTE + 10):
            with pytest.raises(FailedPrecondition):
                await c.join(JoinAsk(f"x{i}", 1.0))
        clock[0] = 61.0
        with pytest.raises(FailedPrecondition):
            await c.join(JoinAsk("late", 1.0))
        return []

    records, _ = refusals(["--workers", "1", "--max-workers", "1", "--global-batch", "64"], joins)
    assert len(records) == REFUSALS_LOGGED_PER_MINUTE + 1
    assert "unlogged" not in records[0] and records[-1]["worker"] == "late" and records[-1]["unlogged"] == 10
    assert progress_line(records[-1]).endswith("(10 more refusals since the last line went unlogged)")

"""Epoch ends as the steps are counted (ps/rounds/epochs.py, milestones.py): under --sampling exact in
ASP a slow worker can hold an epoch's last samples while the others train the whole next epoch, so
both end at one step; the second's record says it trained alongside the first, with its figures.
The coordinator is driven directly (no gRPC)."""

from __future__ import annotations

import asyncio
from typing import Any

from common.transport.messages import JoinAsk
from deploy.slurm_follow import describe
from ps.ops.progress import progress_line, trained_alongside
from ps.rounds.coordinator import Coordinator
from ps.server_job import build_job
from tests.conftest import job_args
from tests.coordinator_rounds import JoinedJob, close_round, joined_job


def epoch_records(jump: int) -> list[dict[str, Any]]:
    """The `epoch` records of a step after which `jump` more epochs are complete."""
    job = build_job(job_args("--mode", "asp", "--workers", "2", "--global-batch", "64", "--epochs", "5",
                             "--sampling", "exact", "--controller", "static"))
    c: Coordinator = job.coordinator

    async def joined() -> None:
        await asyncio.gather(*(c.join(JoinAsk(f"w{i}", 1.0)) for i in range(2)))

    asyncio.run(joined())
    records: list[dict[str, Any]] = []
    c.metrics.observe(lambda r: records.append(r) if r["event"] == "epoch" else None)
    c.sampling.slices.completed = c.epoch + jump
    c.milestones.advance(32)
    return records


def test_two_epochs_ending_at_one_step_write_the_second_as_trained_alongside_the_first() -> None:
    first, second = epoch_records(2)
    assert (first["epoch"], second["epoch"], second["with_epoch"]) == (1, 2, 1)
    assert "with_epoch" not in first
    assert {k: v for k, v in second.items() if k not in ("epoch", "with_epoch", "time", "elapsed_s")} == \
        {k: v for k, v in first.items() if k not in ("epoch", "time", "elapsed_s")}
    assert progress_line(second) == "epoch 2: ended with epoch 1, which trained alongside it"
    assert describe(second) == "epoch 2: ended with epoch 1, which trained alongside it"  # the Slurm follower's line
    assert trained_alongside(first) is None
    (alone,) = epoch_records(1)
    assert alone["epoch"] == 1 and "with_epoch" not in alone


async def whole_set_rounds(rounds: int) -> tuple[list[dict[str, int]], dict[str, int], JoinedJob]:
    """A BSP job whose global batch is its whole training set (5 samples): the batches each round's
    replies tell, the plan, and the job after `rounds` rounds."""
    async with joined_job("--dataset", "teacher", "--dataset-arg", "size=6", "--global-batch", "5", "--epochs",
                          str(rounds), "--controller", "uniform", events=("epoch",)) as job:
        told = []
        for _ in range(rounds):
            told.append({name: job.c.pull(info.worker_id, info.secret, header_only=True).header.batch_size
                         for name, info in job.joined.items()})
            await close_round(job.c, job.joined)
        return told, job.c.policy.plan(), job


def test_a_global_batch_of_the_whole_training_set_trains_each_sample_once_an_epoch_one_epoch_a_round() -> None:
    told, plan, job = asyncio.run(whole_set_rounds(3))
    assert sorted(plan.values()) == [2, 3] and told == [{"a": plan["a"], "b": plan["b"]}] * 3
    report = job.c.sampling.slices.report()
    assert report["trained"] == {"0": 5, "1": 5, "2": 5} and report["exact_epochs"] == [0, 1, 2], report
    assert [(r["epoch"], r["step"]) for r in job.records] == [(1, 1), (2, 2), (3, 3)]
    assert not any("with_epoch" in r for r in job.records) and job.c.done


def test_a_resumed_jobs_summary_throughput_counts_only_the_samples_trained_since_it_started() -> None:
    """The summary divided every sample since the job's first start (the checkpoint's included) by this
    run's wall time: a job resumed at half way reported twice the throughput its epochs did."""
    job = build_job(job_args("--global-batch", "64", "--epochs", "4"))
    c: Coordinator = job.coordinator
    c.resume_at(45, 45, 2, 45 * 64)
    c.epochs.start(100.0)
    for _ in range(10):
        c.epochs.count(64)
    c.epochs.end_time = 101.0
    summary = c.summary()
    assert summary["samples_per_s"] == 640.0
    assert (summary["rounds"], summary["epochs"]) == (45, 2)

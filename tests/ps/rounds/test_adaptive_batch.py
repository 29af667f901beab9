"""`--adaptive-batch gns` on the coordinator: a B₀ outside the range a decision chooses from (larger
than an epoch holds goodput.MIN_STEPS_PER_EPOCH rounds of) moves into it at the first round, before
φ or any round time is measured; a B₀ inside waits for the schedule."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from ps.checkpoint import write_checkpoint
from ps.rounds import adaptive_batch
from ps.control.global_batch.goodput import MIN_STEPS_PER_EPOCH, OUTSIDE
from ps.control.policy import build_policy, with_global_batch
from ps.server_job import build_job
from tests.conftest import job_args
from common.transport.messages import JoinAsk, PushMeta, PushTimes
from common.errors import FailedPrecondition
from tests.coordinator_rounds import close_round, joined_job
from tests.data_files import write_folder

DIGITS_TRAIN = 1438
"""The digits training split: an epoch holds MIN_STEPS_PER_EPOCH (16) rounds of at most 89 samples."""


@pytest.mark.parametrize(("start", "moved_to"), [(1024, DIGITS_TRAIN // MIN_STEPS_PER_EPOCH), (90, 89), (89, None),
                                                 (64, None)])
def test_a_start_an_epoch_cannot_hold_moves_in_at_the_first_round(start: int, moved_to: int | None) -> None:
    async def run() -> None:
        async with joined_job("--global-batch", str(start), "--min-global-batch", "16", "--max-global-batch", "1024",
                              "--adaptive-batch", "gns", events=("adapt",)) as job:
            c, records = job.c, job.records
            assert sum(c.policy.plan().values()) == start
            await close_round(c, job.joined)
            if moved_to is None:
                assert records == [] and sum(c.policy.plan().values()) == start
                return
            assert [(r["current"], r["batch"], r["changed"], r["reason"], r["global_batch"], r["phi"])
                    for r in records] == [(start, moved_to, True, OUTSIDE, moved_to, None)]
            assert sum(c.policy.plan().values()) == moved_to
            for _ in range(3):
                await close_round(c, job.joined)
            assert len(records) == 1  # inside the range now: the schedule decides

    asyncio.run(run())


def checkpoint_at(batch: int, directory: Path, flags: list[str]) -> None:
    """The final checkpoint in `directory` of a job of `flags` whose adaptive B a decision moved to `batch`."""
    first = build_job(job_args(*flags, "--checkpoint-dir", str(directory)))
    try:
        state = first.coordinator.adaptive.decider
        assert state is not None
        state.batch = batch
        c = first.coordinator
        c.replace_policy(build_policy(replace(c.policy.config, global_batch=batch)))
        first.final_checkpoint()
    finally:
        first.evaluator.close()
        first.metrics.close()


def test_a_resume_at_a_b_above_a_smaller_training_set_is_refused(tmp_path: Path) -> None:
    """A checkpoint's adaptive B above the training set it resumes on (an image folder that lost files
    since) is refused at start, naming both numbers, as --global-batch above it is, before the resume
    is recorded; nothing serves."""
    root = write_folder(tmp_path / "images", classes=2, per_class=40)
    flags = ["--dataset", "image_folder", "--dataset-arg", f"root={root}", "--global-batch", "8",
             "--max-global-batch", "64", "--adaptive-batch", "gns"]
    checkpoint_at(60, tmp_path / "ckpt", flags)  # a decision moved B to 60 (of the 64 training images)
    for path in sorted((root / "c1").iterdir())[10:]:
        path.unlink()  # 50 images: 40 to train on
    with pytest.raises(ValueError, match=r"--resume .*ckpt: the checkpoint's adaptive global batch B = 60 exceeds "
                                         r"the training set's 40 samples"):
        build_job(job_args(*flags, "--resume", str(tmp_path / "ckpt"), "--metrics-log", str(tmp_path / "m.jsonl")))
    assert '"resume"' not in (tmp_path / "m.jsonl").read_text()


def test_a_resume_at_a_b_below_the_workers_minimum_batches_is_refused(tmp_path: Path) -> None:
    """A checkpoint's adaptive B below --workers x --min-batch (written at a lower --min-batch, or edited
    by hand) is refused at start, naming both, as --global-batch below it is: resumed, no worker past the
    B-th could join and the job waited for them."""
    flags = ["--global-batch", "32", "--min-global-batch", "16", "--max-global-batch", "64", "--adaptive-batch", "gns"]
    checkpoint_at(16, tmp_path / "ckpt", flags)
    with pytest.raises(ValueError, match=r"--resume .*ckpt: the checkpoint's adaptive global batch B = 16 cannot give "
                                         r"--workers 2 x --min-batch 10 their minimum batches"):
        build_job(job_args(*flags, "--min-batch", "10", "--min-global-batch", "20", "--resume", str(tmp_path / "ckpt"),
                           "--metrics-log", str(tmp_path / "m.jsonl")))
    assert '"resume"' not in (tmp_path / "m.jsonl").read_text()


def test_a_worker_refused_as_the_job_is_full_is_told_the_b_in_force_and_the_bound_that_makes_room() -> None:
    """The join refused where B cannot give one more worker its minimum batch names the global batch a
    decision moved to, and as the advice B's floor: --global-batch is only where B starts, and raising
    it (32, already above the 24 three workers need) would not have let the worker in."""
    async def run() -> None:
        async with joined_job("--global-batch", "32", "--min-batch", "8", "--max-workers", "4", "--min-global-batch", "16",
                              "--adaptive-batch", "gns") as job:
            c = job.c
            c.replace_policy(with_global_batch(c.policy, 16))
            with pytest.raises(FailedPrecondition) as refused:
                await c.join(JoinAsk("c", 1.0))
            message = str(refused.value)
            assert message.startswith("job full: the global batch 16 cannot give one more worker"), message
            assert ("3 workers at --min-batch 8 take a global batch of 24, and --adaptive-batch moves B within "
                    "[--min-global-batch 16, --max-global-batch ") in message, message
            assert message.endswith("(--global-batch 32 is where it started): raise --min-global-batch to 24 or "
                                    "lower --min-batch"), message

    asyncio.run(run())


def test_a_checkpoint_s_noise_scale_smoothing_other_than_the_server_s_is_refused(tmp_path: Path) -> None:
    """The estimator's smoothing is the server's constant (0.98); a file edited to 0 (phi from the last
    round alone) was taken, silently. It is skipped like any unusable file, naming the field."""
    flags = ["--global-batch", "32", "--adaptive-batch", "gns"]
    first = build_job(job_args(*flags))
    try:
        state = first.coordinator.checkpoint_state()
    finally:
        first.evaluator.close()
        first.metrics.close()
    state["adaptive"]["gns"]["smoothing"] = 0.0
    write_checkpoint(tmp_path / "ckpt", state, 0, keep=1)  # the step it holds
    with pytest.raises(ValueError, match=r"no usable checkpoint there \(ckpt-0000000000.pt: .*the checkpoint's noise-scale "
                                         r"smoothing 0.0 is not this server's 0.98"):
        build_job(job_args(*flags, "--resume", str(tmp_path / "ckpt"), "--metrics-log", str(tmp_path / "m.jsonl")))


def test_a_lone_worker_s_sub_batch_measures_the_noise_scale_every_round_and_one_without_is_noted() -> None:
    """A round of one worker gives φ a pair where its push carries a sub-batch's norm; one without (a
    loop of the user's own) is remembered, and a plan that trains that worker alone is no longer one at
    which φ stays measurable."""
    async def run() -> None:
        async with joined_job("--global-batch", "64", "--min-global-batch", "16", "--max-global-batch", "64",
                              "--adaptive-batch", "gns") as job:
            adaptive = job.c.adaptive
            grad = torch.full((job.c.own_numel,), 0.5)
            sq_norm = float(grad.double().square().sum())
            for rounds in (1, 2):
                adaptive.push("a", PushMeta("w-a", 0, 0, 64, PushTimes(7.0), "float32", sub_batch=32,
                                       sub_sq_norm=sq_norm + 3.0), grad)
                adaptive.close(grad)
                assert adaptive.estimator.estimate().rounds == rounds
            noise = adaptive.estimator.estimate().noise
            assert noise == pytest.approx(3.0 / (1 / 32 - 1 / 64))  # (y_s − y)/(1/s − 1/B)
            assert adaptive._measurable_plan({"a": 64, "b": 0}) and adaptive._measurable_plan({"a": 1, "b": 0}) is False
            adaptive.push("a", PushMeta("w-a", 0, 0, 40, PushTimes(7.0), "float32"), grad)  # b left mid-round
            adaptive.close(grad)
            assert adaptive._measurable_plan({"a": 64, "b": 0})  # a was not told to train alone
            adaptive.push("a", PushMeta("w-a", 0, 0, 64, PushTimes(7.0), "float32"), grad)  # told, and no sub-batch
            adaptive.close(grad)
            assert adaptive.estimator.estimate().rounds == 3  # the two lone rounds at 40 and 64: a successive pair
            assert adaptive._measurable_plan({"a": 64, "b": 0}) is False
            assert adaptive._measurable_plan({"a": 0, "b": 64}) and adaptive._measurable_plan({"a": 32, "b": 32})
            adaptive.push("a", PushMeta("w-a", 0, 0, 64, PushTimes(7.0), "float32", sub_batch=32,
                                        sub_sq_norm=sq_norm + 3.0), grad)
            adaptive.close(grad)
            assert adaptive.estimator.estimate().rounds == 4 and adaptive._measurable_plan({"a": 64, "b": 0})

    asyncio.run(run())


def test_a_decision_that_took_d_seconds_of_cpu_waits_d_over_the_share_before_the_next(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """--adapt-every counts rounds; where rounds are short and a decision costly, the decisions would take
    most of the job: the next one waits until the last one's CPU is DECISION_SHARE of the time since."""
    cpu = iter(float(k) for k in range(1000))  # every decision takes one second of its thread's CPU
    monkeypatch.setattr(adaptive_batch.time, "thread_time", lambda: next(cpu))

    async def run() -> None:
        async with joined_job("--global-batch", "64", "--min-global-batch", "16", "--max-global-batch", "64",
                              "--adaptive-batch", "gns", "--adapt-every", "2", events=("adapt",)) as job:
            now = [100.0]
            job.c.clock = lambda: now[0]
            for _ in range(2):
                await close_round(job.c, job.joined)
            assert [r["cpu_ms"] for r in job.records] == [1000.0]
            for _ in range(6):  # --adapt-every 2 rounds, three times over, within the wait
                now[0] += 1.0
                await close_round(job.c, job.joined)
            assert len(job.records) == 1
            now[0] = 100.0 + 1.0 / adaptive_batch.DECISION_SHARE
            await close_round(job.c, job.joined)
            assert len(job.records) == 2

    asyncio.run(run())


def test_no_decision_is_due_while_the_batch_policy_re_probes_and_its_rounds_are_not_b_s_measure() -> None:
    """A re-probe's rounds time a plan with parked workers brought back: they measure neither B nor the
    plan at B, so the decision waits for the policy's next decision, and their times are dropped."""
    async def run() -> None:
        async with joined_job("--global-batch", "64", "--min-global-batch", "16", "--max-global-batch", "64",
                              "--adaptive-batch", "gns", "--adapt-every", "2", events=("adapt",)) as job:
            policy = job.c.policy
            policy.report = lambda: {"phase": "reprobe"}  # type: ignore[method-assign]
            for _ in range(4):
                await close_round(job.c, job.joined)
            assert job.records == [] and job.c.adaptive._round_ms == []
            del policy.report  # the policy judged the re-probe: its own report again
            await close_round(job.c, job.joined)
            assert len(job.records) == 1 and len(job.c.adaptive._round_ms) == 1

    asyncio.run(run())


def test_the_workers_noted_training_alone_without_a_sub_batch_are_kept_in_the_checkpoint(tmp_path: Path) -> None:
    """A resumed job still knows which worker's lone rounds give φ no pair (`unsplit`), instead of
    learning it again from a lone round; a file whose list is not of worker names is refused, naming it."""
    flags = ["--global-batch", "64", "--min-global-batch", "16", "--max-global-batch", "64", "--adaptive-batch", "gns"]

    async def run() -> dict:
        async with joined_job(*flags) as job:
            adaptive = job.c.adaptive
            grad = torch.full((job.c.own_numel,), 0.5)
            adaptive.push("a", PushMeta("w-a", 0, 0, 64, PushTimes(7.0), "float32"), grad)  # told, and no sub-batch
            adaptive.close(grad)
            assert adaptive._unsplit == {"a"}
            return job.c.checkpoint_state()

    state = asyncio.run(run())
    assert state["adaptive"]["unsplit"] == ["a"]
    write_checkpoint(tmp_path / "ckpt", state, 0, keep=1)
    resumed = build_job(job_args(*flags, "--resume", str(tmp_path / "ckpt"), "--metrics-log", str(tmp_path / "m.jsonl")))
    try:
        assert resumed.coordinator.adaptive._unsplit == {"a"}
    finally:
        resumed.evaluator.close()
        resumed.metrics.close()
    state["adaptive"]["unsplit"] = [3]
    write_checkpoint(tmp_path / "bad", state, 0, keep=1)
    with pytest.raises(ValueError, match="adaptive-batch 'unsplit' must be a list of worker names"):
        build_job(job_args(*flags, "--resume", str(tmp_path / "bad"), "--metrics-log", str(tmp_path / "m2.jsonl")))

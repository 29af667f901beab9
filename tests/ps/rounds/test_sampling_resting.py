"""--sampling exact, BSP: a worker the job's last epoch leaves no samples for a round rests. Its reply
tells it batch 0, the round does not wait for its push, and its poll waits like a parked worker's.
The coordinator is driven directly (no gRPC); the last epoch is run down by moving the slices'
cursor, as slices that went back late leave it."""

from __future__ import annotations

import asyncio

import torch

from common.transport.messages import JoinAsk, PushMeta, PushTimes
from ps.rounds.coordinator import Coordinator
from ps.server_job import build_job
from tests.conftest import job_args

LEFT = 100
"""Samples of the job's last permutation (π_E) still to hand out."""


async def run_down_round() -> None:
    job = build_job(job_args("--workers", "3", "--global-batch", "600", "--epochs", "1", "--controller", "static",
                             "--evict-after", "3600", "--round-deadline", "off"))
    c: Coordinator = job.coordinator
    infos = await asyncio.gather(*(c.join(JoinAsk(f"w{i}", 1.0)) for i in range(3)))
    ids = {f"w{i}": (info.worker_id, info.secret) for i, info in enumerate(infos)}
    # what the joins handed goes back, and all but LEFT samples of π_E are gone: epoch 0 is not over
    slices = c.sampling.slices
    for holder in list(slices.held):
        slices.put_back(holder, tally=False)
    slices.returned.clear()
    slices.epoch, slices.cursor = 1, slices.num_samples - LEFT
    c.sampling._opened = None

    told = {name: c.pull(wid, secret).header.batch_size for name, (wid, secret) in ids.items()}
    assert told == {"w0": LEFT, "w1": 0, "w2": 0}  # in the plan's order: the first takes what is left
    assert c.policy.plan() == {"w0": 200, "w1": 200, "w2": 200}  # the plan stands; the samples ran out
    assert c.bsp.parking.required() == {ids["w0"][0]}
    assert c.bsp.parking.is_parked(c.members[ids["w1"][0]]) and not c.bsp.parking.is_parked(c.members[ids["w0"][0]])

    wid, secret = ids["w0"]
    meta = PushMeta(wid, 0, 0, LEFT, PushTimes(1.0), "float32", c.own_numel, secret=secret)
    c.begin_push(meta)
    reply = await asyncio.wait_for(c.push(meta, torch.zeros(c.own_numel)), timeout=10.0)
    assert reply.header.round == 1 and c.round == 1  # the round closed on w0's push alone
    assert c.samples == LEFT


def test_a_worker_the_last_epoch_leaves_no_samples_rests_and_the_round_closes_without_it() -> None:
    asyncio.run(run_down_round())

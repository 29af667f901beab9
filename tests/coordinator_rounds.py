"""Pushes straight into an in-process Coordinator (no RPC): a job built from ps-server flags with two
workers joined, what a worker would push now, and a round closed by every planned worker's push."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from common.transport.messages import JoinAsk, JoinInfo, PushMeta, PushTimes, StepReply
from ps.rounds.coordinator import Coordinator
from ps.rounds.evaluator import BackgroundEvaluator
from ps.server_job import build_job
from tests.conftest import job_args


@dataclass
class JoinedJob:
    """A built job's coordinator and evaluator, its workers a and b (one core each) and the metrics
    records kept."""

    c: Coordinator
    evaluator: BackgroundEvaluator
    joined: dict[str, JoinInfo] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)


@asynccontextmanager
async def joined_job(*flags: str, events: tuple[str, ...] = ()) -> AsyncIterator[JoinedJob]:
    """A job of `flags` (tests.conftest.job_args') with a and b joined, keeping its metrics records of
    the kinds `events`; its evaluator and metrics log closed at the end."""
    built = build_job(job_args("--epochs", "100000", "--evict-after", "3600", *flags))
    c = built.coordinator
    job = JoinedJob(c, built.evaluator)
    c.metrics.observe(lambda r: job.records.append(r) if r["event"] in events else None)
    try:
        job.joined = dict(zip("ab", await asyncio.gather(c.join(JoinAsk("a", 1.0)), c.join(JoinAsk("b", 1.0))),
                              strict=True))
        yield job
    finally:
        built.evaluator.close()
        built.metrics.close()


async def push(c: Coordinator, info: JoinInfo, grad: torch.Tensor | None = None) -> asyncio.Future[StepReply]:
    """`info`'s push of what the server tells it now (a pull's header), taken in; its reply comes later.
    On the fast path a planned worker's push is a report of its step, a probe a gradient."""
    told = c.pull(info.worker_id, info.secret, header_only=True).header
    values = torch.zeros(c.own_numel) if grad is None else grad
    meta = PushMeta(info.worker_id, told.round, told.version, told.batch_size, PushTimes(7.0), "float32",
                    values.numel(), secret=info.secret)
    if c.rendezvous is not None and not told.probe:
        meta, values = replace(meta, num_values=0, kind="report", generation=told.group.generation), torch.zeros(0)
    c.begin_push(meta)
    pushed = asyncio.ensure_future(c.push(meta, values))
    for _ in range(3):
        await asyncio.sleep(0)
    return pushed


async def close_round(c: Coordinator, planned: dict[str, JoinInfo]) -> list[StepReply]:
    """Every planned worker of `planned` pushes: the open round closes; their replies."""
    pushes = [await push(c, info) for info in planned.values()]
    return list(await asyncio.wait_for(asyncio.gather(*pushes), 5))

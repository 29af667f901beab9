"""Pushes straight into an in-process Coordinator (no RPC): what a worker would push now, and a round
closed by every planned worker's push."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import torch

from common.transport.messages import JoinInfo, PushMeta, PushTimes, StepReply
from ps.rounds.coordinator import Coordinator


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

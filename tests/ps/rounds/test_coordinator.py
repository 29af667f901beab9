"""Σ b = B in every BSP round: a worker that joins after the start enters at a round boundary.

The coordinator is driven directly (no gRPC) by honest workers, each pushing the batch size the
server told it for the round, through random sequences of joins, pushes, leaves and evictions. Every
round that steps has Σ b = B exactly, except a round that loses a member while it is open: that one
steps with the samples pushed to it (B less the told batches of the members gone before pushing).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from ps.rounds.coordinator import Coordinator
from ps.server_job import build_job
from common.transport.messages import JoinAsk, PushMeta, PushTimes
from tests.conftest import job_args

B = 24


@dataclass
class Worker:
    """What an honest worker knows: its id and secret, and the round and batch size it was told."""

    name: str
    worker_id: str
    secret: str
    round: int
    batch: int
    pushing: asyncio.Task | None = None


OPS = st.lists(st.tuples(st.sampled_from(["join", "push", "push", "push", "push", "leave", "evict"]), st.integers(0, 9)),
               min_size=1, max_size=40)


async def drive(ops: list[tuple[str, int]], controller: str) -> tuple[list[tuple[int, int]], dict[int, int]]:
    """Run the ops; returns the stepped rounds as (round, Σ b) and, per round, the batches that members
    gone during it had been told and not pushed."""
    job = build_job(job_args("--workers", "2", "--global-batch", str(B), "--max-workers", "5", "--controller", controller,
                             "--epochs", "100000", "--evict-after", "3600", "--adjust-every", "1"))
    c: Coordinator = job.coordinator
    stepped: list[tuple[int, int]] = []
    lost: dict[int, int] = {}
    next_round, remove = c.round_close.next_round, c.departures.remove

    def recording_next_round(batch: int) -> None:
        stepped.append((c.round, batch))
        next_round(batch)

    def recording_remove(worker_id: str, event: str, reason: str, said: str = "") -> None:
        member = c.membership.active.get(worker_id)
        if (member is not None and worker_id not in c.bsp.pushed and c.admission.started.is_set()
                and member.name in c.policy.plan()):  # not one on probation, which no round counts on
            lost[c.round] = lost.get(c.round, 0) + min(member.told.get(c.round, {0}))
        remove(worker_id, event, reason, said)

    activate = c.admission.activate_pending

    def recording_activate() -> None:
        entering = c.membership.pending or any(p.pushed for p in c.probation.probes.values())
        if entering and c.bsp.accumulator is not None and c.bsp.accumulator.count == 0:
            lost[c.round] = 0  # the round starts afresh with the newcomers (nobody was left in it)
        activate()

    c.round_close.next_round, c.departures.remove, c.admission.activate_pending = (  # type: ignore[method-assign]
        recording_next_round, recording_remove, recording_activate)
    grad = torch.zeros(c.own_numel)
    workers: dict[str, Worker] = {}
    admitted: list[int] = []  # the round each Join was admitted at
    joining: dict[str, asyncio.Task] = {}
    names = iter(f"w{i}" for i in range(1000))

    async def join(name: str) -> None:
        info = await c.join(JoinAsk(name, 1.0))
        told = c.pull(info.worker_id, info.secret, header_only=True).header  # its first Pull, before any push
        workers[name] = Worker(name, info.worker_id, info.secret, told.round, told.batch_size)
        admitted.append(info.round)

    async def push(w: Worker) -> None:
        meta = PushMeta(w.worker_id, w.round, 0, w.batch, PushTimes(1.0), "float32", c.own_numel, secret=w.secret)
        c.begin_push(meta)
        reply = await c.push(meta, grad)
        w.round, w.batch = reply.header.round, reply.header.batch_size

    async def settle() -> None:
        for _ in range(5):
            await asyncio.sleep(0)
        for name, task in list(joining.items()):
            if task.done():
                task.result()
                del joining[name]

    for _ in range(2):  # the job starts with its 2 expected workers
        name = next(names)
        joining[name] = asyncio.ensure_future(join(name))
    await settle()
    for op, index in ops:
        idle = [w for w in workers.values() if w.worker_id in c.members and (w.pushing is None or w.pushing.done())]
        member_names = [w.name for w in workers.values() if w.worker_id in c.members]
        if op == "join" and len(member_names) + len(joining) < 5:
            name = next(names)
            joining[name] = asyncio.ensure_future(join(name))
        elif op == "push" and idle:
            w = idle[index % len(idle)]
            w.pushing = asyncio.ensure_future(push(w))
        elif op in ("leave", "evict") and member_names:
            w = workers[member_names[index % len(member_names)]]
            if op == "leave":
                await c.leave(w.worker_id, w.secret)
            else:
                c.members[w.worker_id].last_seen = c.clock() - c.evict_after - 1
                c.evict_stale()
            del workers[w.name]
        await settle()
        assert not c.membership.pending or c.members, "a join waits although nobody holds a round open"
    for task in [*joining.values(), *(w.pushing for w in workers.values() if w.pushing is not None)]:
        task.cancel()
    await asyncio.gather(*joining.values(), *(w.pushing for w in workers.values() if w.pushing), return_exceptions=True)
    job.evaluator.close()
    job.metrics.close()
    event(f"joins admitted after the start: {min(len(admitted) - 2, 3)}")
    return stepped, lost


@settings(max_examples=int(os.environ.get("ROUND_EXAMPLES", "60")), deadline=None)
@given(ops=OPS, controller=st.sampled_from(["uniform", "static", "dynamic"]))
def test_every_stepped_round_sums_to_the_global_batch(ops: list[tuple[str, int]], controller: str) -> None:
    """Random joins (after the start: admitted when the open round closes, re-split in its replies),
    pushes, leaves and evictions: each stepped round's Σ b is B, less what members gone during it had
    been told and not pushed."""
    stepped, lost = asyncio.run(drive(ops, controller))
    event(f"rounds stepped: {min(len(stepped), 5)}{'+' if len(stepped) > 5 else ''}")
    event(f"rounds that lost a member: {sum(1 for r, _ in stepped if lost.get(r))}")
    for round_, total in stepped:
        assert total == B - lost.get(round_, 0), (round_, total, lost, stepped)

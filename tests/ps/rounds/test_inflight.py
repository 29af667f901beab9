"""The pushes in flight (ps/rounds/inflight.py): the waiting pushes are admitted in the order they came,
none waits longer than its bound (then RESOURCE_EXHAUSTED), and a worker that goes loses its streams
still arriving, whose room goes at once to the next waiting push."""

from __future__ import annotations

import asyncio

import pytest

from common.errors import ResourceExhausted
from common.transport.messages import PushMeta
from common.transport.wire import ChunkReceiver
from ps.rounds.inflight import PushesInFlight, PushSlot


def begin(meta: PushMeta) -> ChunkReceiver:
    return ChunkReceiver(meta.num_values, meta.wire_dtype)


def opened(pushes: PushesInFlight, name: str, values: int, cancel: object = lambda: None) -> PushSlot:
    slot = pushes.slot(begin, cancel)  # type: ignore[arg-type]
    slot.begin(PushMeta(name, 0, 0, 1, 1.0, "float32", values))
    return slot


def test_waiting_pushes_are_admitted_in_the_order_they_came() -> None:
    async def run() -> list[str]:
        pushes = PushesInFlight(limit_bytes=400)
        order: list[str] = []
        first = opened(pushes, "a", 80)  # 320 bytes: room for no other beside it
        await first.admit()

        async def wait(name: str, values: int) -> None:
            slot = opened(pushes, name, values)
            await slot.admit()
            order.append(name)
            slot.close()

        big = asyncio.ensure_future(wait("big", 90))
        await asyncio.sleep(0)
        small = asyncio.ensure_future(wait("small", 10))  # it would fit beside `a`, but `big` came first
        await asyncio.sleep(0.01)
        assert order == [] and pushes.bytes == 320
        first.close()
        await asyncio.gather(big, small)
        return order

    assert asyncio.run(run()) == ["big", "small"]


def test_a_push_waits_for_room_at_most_its_bound_then_the_next_moves_up() -> None:
    async def run() -> None:
        pushes = PushesInFlight(limit_bytes=400, wait_s=0.05)
        held = opened(pushes, "held", 100)
        await held.admit()
        late = opened(pushes, "late", 100)
        with pytest.raises(ResourceExhausted, match=r"waited 0.05 s \(--push-admit-wait\).*retry"):
            await late.admit()
        late.close()
        assert pushes.timed_out == 1 and pushes.bytes == 400
        held.close()
        again = opened(pushes, "late", 100)
        await asyncio.wait_for(again.admit(), 1.0)
        again.close()
        assert pushes.bytes == 0 and not pushes.workers

    asyncio.run(run())


def test_a_workers_going_cancels_its_streams_and_their_room_goes_to_the_next() -> None:
    async def run() -> None:
        pushes = PushesInFlight(limit_bytes=400)
        cancelled: list[str] = []
        stalled = opened(pushes, "gone-1", 100, lambda: cancelled.append("streaming"))
        await stalled.admit()  # streaming, never arriving whole
        honest = opened(pushes, "honest", 100)
        admitted = asyncio.ensure_future(honest.admit())
        await asyncio.sleep(0.01)
        assert not admitted.done()
        assert pushes.drop("gone-1", "worker 'gone-1' was evicted; rejoin") == 1
        await asyncio.wait_for(admitted, 1.0)  # at once, not when the stalled stream's handler wakes
        assert cancelled == ["streaming"] and stalled.dropped == "worker 'gone-1' was evicted; rejoin"
        assert pushes.bytes == 400 and ("gone-1", False) not in pushes.workers
        stalled.close()  # the handler's own close changes nothing more
        assert pushes.bytes == 400
        honest.received()
        assert pushes.drop("honest", "left") == 0  # arrived whole: the round's, not cancelled
        honest.close()
        assert pushes.bytes == 0

    asyncio.run(run())


def test_a_stream_dropped_while_it_waits_leaves_the_queue() -> None:
    async def run() -> None:
        pushes = PushesInFlight(limit_bytes=400)
        held = opened(pushes, "held", 100)
        await held.admit()
        tasks: list[asyncio.Future[None]] = []
        slot = opened(pushes, "waiting", 100, lambda: tasks[0].cancel())
        task = asyncio.ensure_future(slot.admit())
        tasks.append(task)
        await asyncio.sleep(0.01)
        pushes.drop("waiting", "left")
        with pytest.raises(asyncio.CancelledError):
            await task
        assert pushes.bytes == 400 and slot.dropped == "left"
        held.close()
        assert pushes.bytes == 0

    asyncio.run(run())


def test_room_freed_while_a_cancelled_waiter_has_not_heard_yet_goes_to_the_next() -> None:
    async def run() -> None:
        pushes = PushesInFlight(limit_bytes=400)
        held = opened(pushes, "held", 100)
        await held.admit()
        first = opened(pushes, "first", 100)
        second = opened(pushes, "second", 100)
        cancelled = asyncio.ensure_future(first.admit())
        waiting = asyncio.ensure_future(second.admit())
        await asyncio.sleep(0.01)
        cancelled.cancel()  # its task has not run its handler yet when the room comes
        held.close()
        await asyncio.wait_for(waiting, 1.0)
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert pushes.bytes == 400
        second.close()
        first.close()
        assert pushes.bytes == 0

    asyncio.run(run())

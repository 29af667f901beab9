"""A hostile caller's load, written from the protocols alone (protos/ and grpc.health.v1): health
Watch streams held open and Push streams that never send a chunk, kept at a number from a thread of
their own (a stream that ends is opened again), and what the server answered them. benchmarks.hostile
runs them beside a job; tests/e2e/test_hostile_load.py checks the bounds they meet."""

from __future__ import annotations

import asyncio
import collections
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import ps_pb2_grpc

Metadata = Sequence[tuple[str, str]]


def own_address() -> str | None:
    """An IPv4 address of this machine beyond loopback (a caller from it is not on loopback), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent, the kernel picks the route's source
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


async def never() -> AsyncIterator[bytes]:
    """A request stream that sends nothing, ever."""
    await asyncio.Event().wait()
    yield b""  # pragma: no cover (never reached)


class Load:
    """`count` calls made by `open_call(channel)` kept open against `target` on a loop of their own
    (a call that ends is opened again after `reopen_s`); `answers` counts how each ended, by its code;
    `streaming` those open now that `started(call)` found under way (a Watch that answered)."""

    def __init__(self, target: str, count: int, open_call: Callable[[grpc.aio.Channel], grpc.aio.Call],
                 started: Callable[[grpc.aio.Call], Awaitable[bool]], reopen_s: float = 0.5) -> None:
        self.target, self.count, self.reopen_s = target, count, reopen_s
        self._open_call, self._started = open_call, started
        self.answers: collections.Counter[str] = collections.Counter()
        self.streaming = self.most_streaming = 0
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._run(),), daemon=True)
        self._thread.start()

    async def _run(self) -> None:
        self._stop = asyncio.Event()
        async with grpc.aio.insecure_channel(self.target) as channel:
            tasks = [asyncio.ensure_future(self._keep(channel)) for _ in range(self.count)]
            await self._stop.wait()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        rest = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in rest:  # gRPC's own, feeding the request streams: ended here, not destroyed pending
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    async def _keep(self, channel: grpc.aio.Channel) -> None:
        while True:
            call = self._open_call(channel)
            try:
                if await self._started(call):
                    self.streaming += 1
                    self.most_streaming = max(self.most_streaming, self.streaming)
                    try:
                        code = await call.code()
                    finally:
                        self.streaming -= 1
                else:
                    code = await call.code()
            except asyncio.CancelledError:
                call.cancel()
                raise
            self.answers[code.name] += 1
            await asyncio.sleep(self.reopen_s)

    def total(self) -> int:
        return sum(self.answers.values())

    def told(self) -> dict[str, str]:
        """The first message of each refusal: none kept (the codes say it)."""
        return {}

    def tally(self) -> dict[str, int]:
        """How the calls ended, by code, and the most under way at once (`most open`)."""
        return {**dict(self.answers), "most open": self.most_streaming}

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


async def answered(call: grpc.aio.Call) -> bool:
    """Whether a response stream sent its first message."""
    try:
        return await call.read() is not grpc.aio.EOF
    except grpc.RpcError:
        return False


async def opened(call: grpc.aio.Call) -> bool:
    """A request stream that sends nothing is under way from the start (until it ends)."""
    return True


def watches(target: str, count: int, metadata: Metadata = (), reopen_s: float = 1.0) -> Load:
    """`count` health Watch streams held open (without the token unless `metadata` carries it)."""
    return Load(target, count, lambda channel: health_pb2_grpc.HealthStub(channel).Watch(
        health_pb2.HealthCheckRequest(), metadata=metadata), answered, reopen_s)


def silent_pushes(target: str, count: int, metadata: Metadata = (), service: str = "ParameterServer",
                  reopen_s: float = 1.0) -> Load:
    """`count` Push streams that never send a chunk (`service`: ParameterServer or ParameterShard)."""
    stub = ps_pb2_grpc.ParameterServerStub if service == "ParameterServer" else ps_pb2_grpc.ParameterShardStub
    return Load(target, count, lambda channel: stub(channel).Push(never(), metadata=metadata), opened, reopen_s)

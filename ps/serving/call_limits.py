"""The server interceptor that holds every call within a CallBudget (ps/serving/call_budget.py): a
call beyond its kind's bound is RESOURCE_EXHAUSTED at once (a worker retries it, within --retry-for),
and a silent request stream that a newer call displaces ends RESOURCE_EXHAUSTED too.

It goes after the token check in a server's interceptors: a call refused for its token is answered
before it is counted, so callers without the token take no place of the job's. It knows the calls a
server holds, so `stop_serving` waits for them to end when the server stops."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc

from common.transport.handler_scope import HandlerInterceptor, scoped
from common.transport.security import peer_host
from ps.serving.call_budget import CallBounds, CallBudget, Refused, Ticket, call_kind


SETTLE_S = 5.0
"""How long a stopped server waits for the handlers of its cancelled calls to unwind."""


class CallLimits(HandlerInterceptor):
    """Counts the calls a server holds, by kind and peer address, and refuses those beyond `bounds`."""

    def __init__(self, bounds: CallBounds) -> None:
        self.budget = CallBudget(bounds)
        self.running: set[asyncio.Task[Any]] = set()  # the tasks of the calls admitted, until they are done

    def wrap(self, method: str, metadata: Any, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        return scoped(handler, functools.partial(self._held, call_kind(method), handler.request_streaming))

    @asynccontextmanager
    async def _held(self, kind: str, streaming: bool, context: grpc.aio.ServicerContext, request: Any) -> AsyncIterator[Any]:
        """A scope (common/transport/handler_scope.py): the call's place, held while it runs."""
        task = asyncio.current_task()
        assert task is not None
        try:
            ticket = self.budget.admit(peer_host(context.peer()), kind, silent=streaming, on_displaced=task.cancel)
        except Refused as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        self.running.add(task)
        task.add_done_callback(self.running.discard)
        try:
            yield Heard(request, self.budget, ticket) if streaming else request
        except asyncio.CancelledError:
            if not ticket.displaced:
                raise
            task.uncancel()
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"this {kind} stream had sent nothing when its kind's calls were full, and a newer "
                                "call took its place; send the first message at once")
        finally:
            self.budget.release(ticket)

    async def settle(self, timeout_s: float = SETTLE_S) -> None:
        """Once the server stopped: wait (at most `timeout_s`) for the handlers of the calls gRPC cancelled
        at the end of its grace to unwind, then give gRPC's own task of each call its turn to see it end.
        A call still running when the event loop closes is cancelled there, in gRPC's wrapper that awaits
        it, which prints the CancelledError's traceback on stderr."""
        running = [task for task in self.running if not task.done()]
        if running:
            await asyncio.wait(running, timeout=timeout_s)
        await asyncio.sleep(0)


async def stop_serving(server: grpc.aio.Server, limits: CallLimits, grace_s: float = 1.0) -> None:
    """Stop `server` quietly: its calls get `grace_s` to end, gRPC cancels those left, and `limits` (its
    interceptor) waits for their handlers to unwind before the caller goes on to close the event loop."""
    await server.stop(grace=grace_s)
    await limits.settle()


class Heard:
    """A request stream that tells the budget when its first message arrives (the call is no longer
    silent, so no newer call displaces it)."""

    def __init__(self, requests: AsyncIterator[Any], budget: CallBudget, ticket: Ticket) -> None:
        self._requests, self._budget, self._ticket = requests, budget, ticket

    def __aiter__(self) -> Heard:
        return self

    async def __anext__(self) -> Any:
        message = await self._requests.__anext__()
        if self._ticket.silent:
            self._budget.heard(self._ticket)
        return message

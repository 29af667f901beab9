"""Server interceptors that replace a method's handler, and a handler whose every call runs inside a
scope: what an interceptor uses to act on a call where only the call itself knows enough (its peer's
address, its first message), before and after the servicer's behavior, whichever of gRPC's four
kinds of handler it is."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import grpc

Scope = Callable[[grpc.aio.ServicerContext, Any], AbstractAsyncContextManager[Any]]
"""(context, the request or the request iterator) -> an async context manager around the call; what
it yields is what the behavior gets in place of the request (the same, or a wrapped iterator)."""


class HandlerInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc ships no types: its classes are Any
    """An interceptor that gives every call of a registered method the handler `wrap` makes of its own."""

    def wrap(self, method: str, metadata: Any, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """The handler that serves calls of `method` (its full path) carrying `metadata`."""
        raise NotImplementedError

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:  # no such method: gRPC answers UNIMPLEMENTED
            return handler
        return self.wrap(handler_call_details.method, handler_call_details.invocation_metadata, handler)


def scoped(handler: grpc.RpcMethodHandler, scope: Scope) -> grpc.RpcMethodHandler:
    """A handler of `handler`'s kind, with its serializers, whose behavior runs inside `scope`.

    gRPC tells a streaming behavior that writes with `context.write` from one that yields by whether
    it is an async generator function; the wrapper is of the same sort."""
    if handler.request_streaming and handler.response_streaming:
        behavior, make = handler.stream_stream, grpc.stream_stream_rpc_method_handler
    elif handler.request_streaming:
        behavior, make = handler.stream_unary, grpc.stream_unary_rpc_method_handler
    elif handler.response_streaming:
        behavior, make = handler.unary_stream, grpc.unary_stream_rpc_method_handler
    else:
        behavior, make = handler.unary_unary, grpc.unary_unary_rpc_method_handler

    if inspect.isasyncgenfunction(behavior):
        async def streamed(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async with scope(context, request) as given:
                async for reply in behavior(given, context):
                    yield reply

        call: Any = streamed
    else:
        async def awaited(request: Any, context: grpc.aio.ServicerContext) -> Any:
            async with scope(context, request) as given:
                return await behavior(given, context)

        call = awaited
    return make(call, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)

"""Registers the servicer with a grpc.aio server, so that a malformed unary request is INVALID_ARGUMENT.

grpc decodes a unary request before the servicer method runs and reports a DecodeError as UNKNOWN.
Here the request deserializers never raise: an undecodable request arrives as `Undecodable` and is
refused before the servicer sees it. Streamed requests (Push, Load) are chunk messages parsed by
`data_view_parser` (their `data` a view of the received bytes, not a copy); the servicer turns the
DecodeError raised while it reads the stream into INVALID_ARGUMENT itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.message import DecodeError

from protos import ps_pb2
from common.transport.serialized import data_view_parser, passthrough

SERVICES = ps_pb2.DESCRIPTOR.services_by_name


@dataclass(frozen=True)
class Undecodable:
    """Stands in for a request whose bytes are not a valid message of its type."""

    type_name: str
    error: str

    def describe(self) -> str:
        return f"the request is not a valid {self.type_name} message: {self.error}"


def tolerant_parser(message_type: Any) -> Callable[[bytes], Any]:
    """`message_type.FromString`, answering `Undecodable` instead of raising."""

    def parse(data: bytes) -> Any:
        try:
            return message_type.FromString(data)
        except DecodeError as exc:
            return Undecodable(message_type.DESCRIPTOR.name, str(exc))

    return parse


def _guard_unary(behavior: Callable[[Any, Any], Awaitable[Any]]) -> Callable[[Any, Any], Awaitable[Any]]:
    async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.describe())
        return await behavior(request, context)

    return handle


def _guard_unary_stream(behavior: Callable[[Any, Any], AsyncIterator[Any]]) -> Callable[[Any, Any], AsyncIterator[Any]]:
    async def handle(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        if isinstance(request, Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.describe())
        async for reply in behavior(request, context):
            yield reply

    return handle


OnMessage = Callable[[str, str, int], None]
"""(method, "received" or "sent", bytes): told of every message a handler parses or sends (metrics)."""


def _counted(method: str, parse: Callable[[bytes], Any], serialize: Callable[[Any], bytes],
             on_message: OnMessage) -> tuple[Callable[[bytes], Any], Callable[[Any], bytes]]:
    """`parse` and `serialize` telling `on_message` the size of each message they handle."""

    def counted_parse(raw: bytes) -> Any:
        on_message(method, "received", len(raw))
        return parse(raw)

    def counted_serialize(message: Any) -> bytes:
        data = serialize(message)
        on_message(method, "sent", len(data))
        return data

    return counted_parse, counted_serialize


def method_handlers(servicer: Any, service: str = "ParameterServer",
                    on_message: OnMessage | None = None) -> dict[str, grpc.RpcMethodHandler]:
    """One handler per method of `service` (ParameterServer or ParameterShard), built from its descriptor."""
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in SERVICES[service].methods:
        request_type = message_factory.GetMessageClass(method.input_type)
        reply_type = message_factory.GetMessageClass(method.output_type)
        behavior = getattr(servicer, method.name)
        parse = data_view_parser(request_type) if method.client_streaming else tolerant_parser(request_type)
        serialize = passthrough(reply_type.SerializeToString)  # bytes: a reply serialized once for many streams
        if on_message is not None:
            parse, serialize = _counted(method.name, parse, serialize, on_message)
        if method.client_streaming:
            make = grpc.stream_stream_rpc_method_handler if method.server_streaming else grpc.stream_unary_rpc_method_handler
            handlers[method.name] = make(behavior, request_deserializer=parse, response_serializer=serialize)
        elif method.server_streaming:
            handlers[method.name] = grpc.unary_stream_rpc_method_handler(
                _guard_unary_stream(behavior), request_deserializer=parse, response_serializer=serialize)
        else:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                _guard_unary(behavior), request_deserializer=parse, response_serializer=serialize)
    return handlers


def register(servicer: Any, server: grpc.aio.Server, service: str = "ParameterServer",
             on_message: OnMessage | None = None) -> None:
    """Adds the servicer's methods to `server` (instead of the generated add_..._to_server); `on_message`
    is told the size of every message (None: nothing counted, no cost)."""
    handlers = method_handlers(servicer, service, on_message)
    full_name = SERVICES[service].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(full_name, handlers),))
    if hasattr(server, "add_registered_method_handlers"):
        server.add_registered_method_handlers(full_name, handlers)

"""The servicers' shared encoding: a ServiceError's gRPC status code, and a core's StepReply as the
serialized ParamsChunk stream that Push and Pull answer with (the ParameterServer's and the shards';
the header converted by common.transport.proto_convert)."""

from __future__ import annotations

from collections.abc import Iterator

import grpc

from protos import ps_pb2
from common.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ServiceError,
    Unauthenticated,
)
from common.transport.messages import StepReply
from common.transport.proto_convert import step_header_to_proto
from common.transport.serialized import data_header


_CODES: dict[type[ServiceError], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
}


def status_code(error: ServiceError) -> grpc.StatusCode:
    for cls in type(error).__mro__:
        if cls in _CODES:
            return _CODES[cls]
    return grpc.StatusCode.INTERNAL


def params_chunk(seq: int, nbytes: int) -> bytes:
    """What a serialized ParamsChunk puts before payload chunk `seq`'s data (the cores' Payload frame;
    the data is written after it in place). Its message seq is seq + 1: message 0 of a reply is the
    header alone."""
    return data_header(ps_pb2.ParamsChunk(seq=seq + 1), nbytes)


def reply_messages(reply: StepReply) -> Iterator[bytes]:
    """A StepReply as a serialized ParamsChunk stream: the header message, then the payload chunks.

    The core's payload chunks are already serialized ParamsChunks (the servicers have the core's
    Payload frame them with `params_chunk`), built once per parameter version and shared by every
    reply that carries it, as they are: a reply adds only its own header message (seq 0, no data).
    The response serializer passes bytes through (common/transport/handlers.py, common/transport/serialized.py), so gRPC sends
    these as they are.
    """
    yield ps_pb2.ParamsChunk(header=step_header_to_proto(reply.header)).SerializeToString()
    yield from reply.payload  # framed as they are reached (common.transport.payload), the first while later ones step

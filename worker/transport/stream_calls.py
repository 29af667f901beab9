"""The streaming calls a worker opens on a channel, to the coordinator or to a shard server: Push, fed
serialized chunks, and Pull; both parse the reply's ParamsChunks as views of the received bytes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc

from protos import ps_pb2
from common.transport.serialized import data_view_parser, passthrough
from worker.probes.cpu_parts import PROBE

PushCall = Callable[[Iterator[bytes]], Any]
"""A server's Push: the serialized chunks in, the reply's chunks out (a gRPC call, its requests counted
by the probe when the CPU-parts audit is on: worker.probes.cpu_parts)."""

_PARAMS_CHUNK = PROBE.timed("receive", data_view_parser(ps_pb2.ParamsChunk))  # replies' data as views of the received bytes


def push_call(channel: grpc.Channel, service: str) -> PushCall:
    """`service`'s Push, taking serialized PushChunks (common/transport/serialized.py) as well as messages."""
    full_name = ps_pb2.DESCRIPTOR.services_by_name[service].full_name
    call = channel.stream_stream(f"/{full_name}/Push", request_serializer=passthrough(ps_pb2.PushChunk.SerializeToString),
                                 response_deserializer=_PARAMS_CHUNK)
    return PROBE.fed("push_send", call)


def pull_call(channel: grpc.Channel, service: str) -> grpc.UnaryStreamMultiCallable:
    """`service`'s Pull, its ParamsChunks parsed as Push's are."""
    full_name = ps_pb2.DESCRIPTOR.services_by_name[service].full_name
    return channel.unary_stream(f"/{full_name}/Pull", request_serializer=ps_pb2.PullRequest.SerializeToString,
                                response_deserializer=_PARAMS_CHUNK)

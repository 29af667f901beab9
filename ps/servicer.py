"""The gRPC servicer: decode, validate the envelope, call the coordinator, encode. No logic."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import grpc
from google.protobuf.message import DecodeError

from protos import ps_pb2, ps_pb2_grpc
from ps.coordinator import Coordinator
from ps.core_messages import StepReply
from ps.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ServiceError,
    Unauthenticated,
)
from ps.push_stream import receive_push
from ps.serialized import DataChunk, data_header

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
    The response serializer passes bytes through (ps/handlers.py, ps/serialized.py), so gRPC sends
    these as they are.
    """
    header = ps_pb2.ParamsHeader(
        round=reply.round,
        version=reply.version,
        epoch=reply.epoch,
        batch_size=reply.batch_size,
        done=reply.done,
        wire_dtype=reply.wire_dtype,
        num_values=reply.num_values,
        lr=reply.lr,
        global_batch=reply.global_batch,
        reason=reply.reason,
        generation=reply.group.generation,
        rank=reply.group.rank,
        world_size=reply.group.world_size,
        backend=reply.group.backend,
        snapshot_requested=reply.snapshot_requested,
        hub_rank=reply.group.hub_rank,
        optimizer_state=reply.optimizer_state,
    )
    yield ps_pb2.ParamsChunk(header=header).SerializeToString()
    yield from reply.payload  # framed as they are reached (ps.payload), the first while later ones step


class ParameterServerServicer(ps_pb2_grpc.ParameterServerServicer):
    """Translates RPCs to Coordinator calls and ServiceErrors to gRPC statuses."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.core = coordinator
        coordinator.payload.use_frame(params_chunk)

    async def Join(self, request: ps_pb2.JoinRequest, context: grpc.aio.ServicerContext) -> ps_pb2.JoinReply:
        try:
            info = await self.core.join(request.name, request.cores, request.cuda_device if request.cuda else None)
        except ServiceError as exc:
            await context.abort(status_code(exc), str(exc))
        layout = [ps_pb2.TensorSpec(name=e.name, shape=e.shape, dtype=e.dtype) for e in self.core.layout.entries]
        return ps_pb2.JoinReply(
            worker_id=info.worker_id,
            secret=info.secret,
            job_json=self.core.spec.to_json(),
            layout=layout,
            num_params=self.core.layout.numel,
            batch_size=info.batch_size,
            round=info.round,
            version=info.version,
            epoch=info.epoch,
            index=info.index,
            heartbeat_interval_s=self.core.heartbeat_interval,
            rendezvous_host=info.rendezvous_host,
            rendezvous_port=info.rendezvous_port,
            rank=info.group.rank,
            world_size=info.group.world_size,
            generation=info.group.generation,
            backend=info.group.backend,
            shards=[ps_pb2.ShardInfo(address=a, start=start, stop=stop) for a, start, stop in info.shards],
        )

    async def Push(
        self, request_iterator: AsyncIterator[DataChunk], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        try:
            meta, receiver = await receive_push(request_iterator, self.core.begin_push)
            reply = await self.core.push(meta, receiver.finish())
        except ServiceError as exc:
            await context.abort(status_code(exc), str(exc))
        except DecodeError as exc:  # the stream's messages are decoded here, as they are read
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"a push chunk is not a valid PushChunk message: {exc}")
        for message in reply_messages(reply):
            yield message
        self.core.note_reply_sent()

    async def Pull(
        self, request: ps_pb2.PullRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        try:
            reply = self.core.pull(request.worker_id, request.secret, header_only=request.header_only,
                                   optimizer_state=request.optimizer_state)
        except ServiceError as exc:
            await context.abort(status_code(exc), str(exc))
        for message in reply_messages(reply):
            yield message
        self.core.note_reply_sent()

    async def Leave(self, request: ps_pb2.LeaveRequest, context: grpc.aio.ServicerContext) -> ps_pb2.LeaveReply:
        try:
            await self.core.leave(request.worker_id, request.secret)
        except ServiceError as exc:
            await context.abort(status_code(exc), str(exc))
        return ps_pb2.LeaveReply()

    async def Heartbeat(
        self, request: ps_pb2.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> ps_pb2.HeartbeatReply:
        try:
            beat = self.core.heartbeat(request.worker_id, request.secret)
        except ServiceError as exc:
            await context.abort(status_code(exc), str(exc))
        return ps_pb2.HeartbeatReply(done=beat.done, epoch=beat.epoch, round=beat.round, version=beat.version)

    async def Status(self, request: ps_pb2.StatusRequest, context: grpc.aio.ServicerContext) -> ps_pb2.StatusReply:
        s = self.core.status()
        return ps_pb2.StatusReply(
            mode=s["mode"],
            controller=s["controller"],
            round=s["round"],
            version=s["version"],
            epoch=s["epoch"],
            epochs=s["epochs"],
            done=s["done"],
            global_batch=s["global_batch"],
            adjustments=s["adjustments"],
            last_accuracy=-1.0 if s["last_accuracy"] is None else s["last_accuracy"],
            expected_workers=s["expected_workers"],
            path=s["path"],
            workers=[ps_pb2.WorkerStatus(**w) for w in s["workers"]],
        )

"""The gRPC servicer of a shard server: decode, call the ShardCore, encode. No logic."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
from google.protobuf.message import DecodeError

from protos import ps_pb2, ps_pb2_grpc
from common.errors import InvalidArgument, ServiceError
from ps.shards.core import ShardCore
from common.transport.chunk_frames import blob_chunks, params_chunk, reply_messages
from common.transport.messages import ShardAck
from common.transport.proto_convert import pull_ask_from_proto, shard_ack_to_proto, shard_commit_from_proto
from common.transport.serialized import DataChunk
from ps.serving import blob
from ps.serving.push_stream import receive_push
from ps.serving.reply_stream import PullsHeld, taken_within
from ps.serving.status_codes import status_code
from ps.shards.flags import DEFAULT_MAX_LOAD_MIB

PUSH_IDLE_S = 30.0
"""A push stream that sends no chunk for this long is dropped, and a reply whose caller takes no chunk
for this long is cancelled (ps-server's --push-idle, for the shards' ranges)."""


class ParameterShardServicer(ps_pb2_grpc.ParameterShardServicer):
    """Translates shard RPCs to ShardCore calls and ServiceErrors to gRPC statuses."""

    def __init__(self, core: ShardCore, on_load: Callable[[], Awaitable[None]] | None = None,
                 max_load_bytes: int = DEFAULT_MAX_LOAD_MIB << 20) -> None:
        """`on_load`: awaited after every load that succeeded (the shard holds a range: health SERVING);
        `max_load_bytes`: the most a Load may carry (it is held whole before it is read)."""
        self.core = core
        self.on_load = on_load
        self.max_load_bytes = max_load_bytes
        self.pulls = PullsHeld()
        core.payload.use_frame(params_chunk)

    async def Push(
        self, request_iterator: AsyncIterator[DataChunk], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        try:
            meta, receiver = await receive_push(request_iterator, self.core.begin_push, PUSH_IDLE_S)
            reply = await self.core.push(meta, receiver.finish())
        except ServiceError as exc:
            await context.abort(status_code(exc), str(exc))
        except DecodeError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"a push chunk is not a valid PushChunk message: {exc}")
        async for message in taken_within(reply_messages(reply), PUSH_IDLE_S):
            yield message

    async def Pull(self, request: ps_pb2.PullRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        ask = pull_ask_from_proto(request)
        with contextlib.ExitStack() as held:
            try:
                ask.check()
                self.core.caller(ask.worker_id, ask.secret)  # who it is, before what it holds is told
                held.enter_context(self.pulls.holding(ask.worker_id))
                reply = self.core.pull(ask.worker_id, ask.secret, header_only=ask.header_only,
                                       optimizer_state=ask.optimizer_state, wait_for_batch=ask.wait_for_batch)
            except ServiceError as exc:
                await context.abort(status_code(exc), str(exc))
            async for message in taken_within(reply_messages(reply), PUSH_IDLE_S):
                yield message

    async def Load(self, request_iterator: AsyncIterator[DataChunk], context: grpc.aio.ServicerContext) -> ps_pb2.ShardAck:
        try:
            parts, size = [], 0
            async for chunk in request_iterator:
                size += len(chunk.data)
                if size > self.max_load_bytes:
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"a shard load of more than "
                                        f"{self.max_load_bytes >> 20} MiB is refused (ps-shard --max-load-mib)")
                parts.append(chunk.data)
            state = blob.unpack(parts)
            if not isinstance(state, dict):
                raise InvalidArgument("a shard load is a dict (spec, start, stop, round, params, optimizer)")
            self.core.load(state)
        except (ServiceError, KeyError, TypeError, ValueError) as exc:
            code = status_code(exc) if isinstance(exc, ServiceError) else grpc.StatusCode.INVALID_ARGUMENT
            await context.abort(code, f"bad shard load: {exc}")
        except DecodeError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"a load chunk is not a valid BlobChunk message: {exc}")
        if self.on_load is not None:
            await self.on_load()
        return shard_ack_to_proto(ShardAck(self.core.round))

    async def Commit(self, request: ps_pb2.CommitRequest, context: grpc.aio.ServicerContext) -> ps_pb2.ShardAck:
        commit = shard_commit_from_proto(request)
        try:
            ack = await self.core.commit(commit.round, commit.batches(), commit.lr, commit.wait_s, commit.revoked)
        except ServiceError as exc:
            await context.abort(status_code(exc), str(exc))
        return shard_ack_to_proto(ack)

    async def Fetch(self, request: ps_pb2.FetchRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[ps_pb2.BlobChunk]:
        try:
            parts = blob.pack(self.core.fetch())
        except ServiceError as exc:
            await context.abort(status_code(exc), str(exc))
        for chunk in blob_chunks(parts):
            yield chunk

"""The gRPC servicer: decode, validate the envelope, call the coordinator, encode. No logic."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
from google.protobuf.message import DecodeError

from protos import ps_pb2, ps_pb2_grpc
from common.errors import ServiceError
from ps.rounds.coordinator import Coordinator
from common.transport.chunk_frames import params_chunk, reply_messages
from common.transport.proto_convert import (
    beat_to_proto,
    caller_from_proto,
    job_status_to_proto,
    join_ask_from_proto,
    join_to_proto,
    leave_from_proto,
    leave_reply,
    pull_ask_from_proto,
    store_answer_to_proto,
    store_call_from_proto,
)
from common.transport.serialized import DataChunk
from ps.serving.push_stream import receive_push
from ps.serving.reply_stream import PullsHeld, taken_within
from ps.serving.status_codes import status_code


class ParameterServerServicer(ps_pb2_grpc.ParameterServerServicer):
    """Translates RPCs to Coordinator calls and ServiceErrors to gRPC statuses."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.core = coordinator
        self.pulls = PullsHeld()
        coordinator.payload.use_frame(params_chunk)

    async def Join(self, request: ps_pb2.JoinRequest, context: grpc.aio.ServicerContext) -> ps_pb2.JoinReply:
        try:
            info = await self.core.join(join_ask_from_proto(request))
        except ServiceError as exc:
            await context.abort(status_code(exc), str(exc))
        return join_to_proto(info)

    async def Push(
        self, request_iterator: AsyncIterator[DataChunk], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        task = asyncio.current_task()
        assert task is not None
        # one push per worker, the bytes cap, cancelled when its worker goes (ps.rounds.inflight)
        slot = self.core.in_flight.slot(self.core.begin_push, task.cancel)
        try:
            meta, receiver = await receive_push(request_iterator, slot.begin, self.core.limits.push_idle_s, slot.admit)
            slot.received()
            reply = await self.core.push(meta, receiver.finish())
        except ServiceError as exc:
            await context.abort(status_code(exc), str(exc))
        except DecodeError as exc:  # the stream's messages are decoded here, as they are read
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"a push chunk is not a valid PushChunk message: {exc}")
        except asyncio.CancelledError:
            if slot.dropped is None:
                raise
            task.uncancel()  # its worker left or was evicted: the stream ends with why
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, slot.dropped)
        finally:
            slot.close()  # before the reply goes out: the worker's next push may follow it at once
        async for message in taken_within(reply_messages(reply), self.core.limits.push_idle_s):
            yield message
        self.core.note_reply_sent()

    async def Pull(
        self, request: ps_pb2.PullRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        ask = pull_ask_from_proto(request)
        with contextlib.ExitStack() as held:
            try:
                ask.check()
                self.core.member(ask.worker_id, ask.secret)  # who it is, before what it holds is told
                held.enter_context(self.pulls.holding(ask.worker_id))
                if ask.wait_for_batch:
                    await self.core.wait_for_batch(ask.worker_id, ask.secret)
                reply = self.core.pull(ask.worker_id, ask.secret, header_only=ask.header_only,
                                       optimizer_state=ask.optimizer_state)
            except ServiceError as exc:
                await context.abort(status_code(exc), str(exc))
            async for message in taken_within(reply_messages(reply), self.core.limits.push_idle_s):
                yield message
        self.core.note_reply_sent()

    async def Leave(self, request: ps_pb2.LeaveRequest, context: grpc.aio.ServicerContext) -> ps_pb2.LeaveReply:
        ask = leave_from_proto(request)
        try:
            await self.core.leave(ask.worker_id, ask.secret, ask.reason)
        except ServiceError as exc:
            await context.abort(status_code(exc), str(exc))
        return leave_reply()

    async def Heartbeat(
        self, request: ps_pb2.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> ps_pb2.HeartbeatReply:
        caller = caller_from_proto(request)
        try:
            beat = self.core.heartbeat(caller.worker_id, caller.secret)
        except ServiceError as exc:
            await context.abort(status_code(exc), str(exc))
        return beat_to_proto(beat)

    async def Rendezvous(self, request: ps_pb2.StoreRequest, context: grpc.aio.ServicerContext) -> ps_pb2.StoreReply:
        try:
            answer = await self.core.rendezvous_call(request.worker_id, request.secret, store_call_from_proto(request))
        except ServiceError as exc:
            await context.abort(status_code(exc), str(exc))
        return store_answer_to_proto(answer)

    async def Status(self, request: ps_pb2.StatusRequest, context: grpc.aio.ServicerContext) -> ps_pb2.StatusReply:
        return job_status_to_proto(self.core.status())

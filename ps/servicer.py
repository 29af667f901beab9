"""The gRPC servicer: decode, validate the envelope, call the coordinator, encode. No logic."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from google.protobuf.message import DecodeError

from protos import ps_pb2, ps_pb2_grpc
from common.errors import ServiceError
from ps.rounds.coordinator import Coordinator
from common.transport.proto_convert import join_to_proto, store_answer_to_proto, store_call_from_proto
from ps.serving.push_stream import receive_push
from ps.serving.replies import params_chunk, reply_messages, status_code
from common.transport.serialized import DataChunk


class ParameterServerServicer(ps_pb2_grpc.ParameterServerServicer):
    """Translates RPCs to Coordinator calls and ServiceErrors to gRPC statuses."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.core = coordinator
        coordinator.payload.use_frame(params_chunk)

    async def Join(self, request: ps_pb2.JoinRequest, context: grpc.aio.ServicerContext) -> ps_pb2.JoinReply:
        try:
            info = await self.core.join(request.name, request.cores, request.cuda_device if request.cuda else None,
                                        request.max_batch or None, request.dataset_length, request.dataset_fingerprint,
                                        request.switch_paths)
        except ServiceError as exc:
            await context.abort(status_code(exc), str(exc))
        return join_to_proto(info)

    async def Push(
        self, request_iterator: AsyncIterator[DataChunk], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        slot = self.core.in_flight.slot(self.core.begin_push)  # one push per worker, the bytes cap (ps.rounds.inflight)
        try:
            meta, receiver = await receive_push(request_iterator, slot.begin, self.core.limits.push_idle_s, slot.admit)
            slot.received()
            reply = await self.core.push(meta, receiver.finish())
        except ServiceError as exc:
            await context.abort(status_code(exc), str(exc))
        except DecodeError as exc:  # the stream's messages are decoded here, as they are read
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"a push chunk is not a valid PushChunk message: {exc}")
        finally:
            slot.close()  # before the reply goes out: the worker's next push may follow it at once
        for message in reply_messages(reply):
            yield message
        self.core.note_reply_sent()

    async def Pull(
        self, request: ps_pb2.PullRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        try:
            if request.wait_for_batch:
                await self.core.wait_for_batch(request.worker_id, request.secret)
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

    async def Rendezvous(self, request: ps_pb2.StoreRequest, context: grpc.aio.ServicerContext) -> ps_pb2.StoreReply:
        try:
            answer = await self.core.rendezvous_call(request.worker_id, request.secret, store_call_from_proto(request))
        except ServiceError as exc:
            await context.abort(status_code(exc), str(exc))
        return store_answer_to_proto(answer)

    async def Status(self, request: ps_pb2.StatusRequest, context: grpc.aio.ServicerContext) -> ps_pb2.StatusReply:
        s = self.core.status()
        return ps_pb2.StatusReply(
            job_json=self.core.spec.to_json(),
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
            path_why=s["path_why"],
            adaptive_batch=s["adaptive_batch"],
            noise_scale=-1.0 if s["noise_scale"] is None else s["noise_scale"],
            efficiency=-1.0 if s["efficiency"] is None else s["efficiency"],
            lr=s["lr"],
            workers=[ps_pb2.WorkerStatus(**w) for w in s["workers"]],
        )

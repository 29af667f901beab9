"""The worker's gRPC client: the only worker module that knows about the transport.

It turns RPCs into plain values (common.transport.messages, converted by
common.transport.proto_convert): a Joined record at Join, a StepHeader after every push or pull (the new
parameters are decoded straight into a caller-owned fp32 buffer). It keeps the secret each
Join returned and sends it with every later call that names that worker id (ps/serving/worker_keys.py).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, fields, replace
from typing import Any

import grpc
import torch

from protos import ps_pb2, ps_pb2_grpc
from common.errors import InvalidArgument
from common.job.spec import JobSpec
from common.transport.messages import (Beat, Caller, JobStatus, JoinAsk, JoinInfo, PullAsk, PushMeta, PushTimes,
                                       ShardTarget, StepHeader, StoreAnswer, StoreCall)
from common.transport.chunk_frames import push_end_message, push_frame
from common.transport.payload import frame_tensor
from common.transport.proto_convert import (beat_from_proto, heartbeat_to_proto, job_status_from_proto, join_ask_to_proto,
                                            join_from_proto, leave_to_proto, pull_ask_to_proto, status_request,
                                            step_header_from_proto, store_answer_from_proto, store_call_to_proto)
from common.transport.security import PathArg
from common.transport.serialized import DataChunk, data_view_parser, passthrough
import worker.transport.server_checks as server_checks
from worker.probes.cpu_parts import PROBE
from worker.transport.channel import open_channel
from worker.transport.bucket_stream import BucketStream, Lane, PushTiming
from worker.transport.arrivals import Arrivals
from common.transport.wire import CHUNK_BYTES, FlatReceiver

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 5.0  # PSClient.close: how long a channel close may take before it is given up
LEAVE_TIMEOUT_S = 10.0  # PSClient.leave: how long to wait for the server to answer a Leave

WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")
_NO_VALUES = torch.empty(0)
PushCall = Callable[[Iterator[bytes]], Any]
"""A server's Push: the serialized chunks in, the reply's chunks out (a gRPC call, its requests counted
by the probe when the CPU-parts audit is on: worker.probes.cpu_parts)."""


class ServerError(RuntimeError):
    """The server refused a call or could not be reached; `code` is the gRPC status name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def reachable_address(host: str, port: int, server_target: str) -> tuple[str, int]:
    """Where to reach a service the server advertises (a shard): a wildcard host (bound
    to all interfaces) means the host of the server's own address."""
    if host in WILDCARD_HOSTS:
        host = server_target.rsplit(":", 1)[0].strip("[]")
    return host, port


@dataclass(frozen=True, kw_only=True)
class Joined(JoinInfo):
    """A Join's reply as the worker holds it: the job spec decoded, the shards' addresses reachable."""

    spec: JobSpec

    @classmethod
    def of(cls, info: JoinInfo, spec: JobSpec) -> Joined:
        return cls(**{f.name: getattr(info, f.name) for f in fields(info)}, spec=spec)


@dataclass(frozen=True)
class _ShardLink:
    """An open connection to one shard server: its range, channel, and Push and Pull callables."""

    target: ShardTarget
    channel: grpc.Channel
    push: PushCall
    pull: grpc.UnaryStreamMultiCallable


def _error(exc: grpc.RpcError) -> ServerError:
    return ServerError(exc.code().name, exc.details() or "")


class PSClient:
    """Blocking client for one parameter server. Calls name a worker id; the client adds the secret its
    Join returned for that id (none for an id it did not join as: the server refuses the call)."""

    def __init__(
        self,
        target: str,
        chunk_bytes: int = CHUNK_BYTES,
        *,
        token: str | None = None,
        tls_ca: PathArg | None = None,
        tls_cert: PathArg | None = None,
        tls_key: PathArg | None = None,
        allowed_shard_hosts: Sequence[str] = (),
    ) -> None:
        """`allowed_shard_hosts`: hosts other than the server's own where this client follows the
        server to shard servers (worker.transport.server_checks.shard_ranges)."""
        self.target = target
        self.allowed_shard_hosts = tuple(allowed_shard_hosts)
        self.chunk_bytes = max(4, chunk_bytes - chunk_bytes % 4)  # whole values of every wire dtype
        self.last_push = PushTiming()  # the latest push's (not recorded with --shards)
        self.declared: tuple[int, str] = (0, "")  # the training set every Join declares: (length, fingerprint)
        self.switch_paths = False  # every Join says whether the worker can follow --allreduce auto's trial
        self._open_channel = functools.partial(open_channel, token=token, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key)
        self._channel = self._open_channel(target)
        self._stub = ps_pb2_grpc.ParameterServerStub(self._channel)
        self._push = _push_call(self._channel, "ParameterServer")
        self._pull = _pull_call(self._channel, "ParameterServer")
        # --shards: the coordinator holds values [0, own_stop); each shard one range after it
        self._own_stop: int | None = None
        self._shards: list[_ShardLink] = []
        self._pool: ThreadPoolExecutor | None = None
        self._receiving: ThreadPoolExecutor | None = None  # streamed replies' values (one thread per server)
        self._secrets: dict[str, str] = {}  # worker id -> the secret its Join returned

    def secret(self, worker_id: str) -> str:
        """The secret this client's Join got for `worker_id` ("" if none)."""
        return self._secrets.get(worker_id, "")

    def use_secret(self, worker_id: str, secret: str) -> None:
        """Send `secret` with the calls naming `worker_id` (a worker that joined through another client)."""
        self._secrets[worker_id] = secret

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> bool:
        """Close the channels; False if that did not finish within `timeout` seconds and was given up.

        A call interrupted by an exception from a signal handler (SIGTERM or Ctrl-C while it waits)
        can make gRPC's channel close wait forever (grpc/grpc#19973); the close then runs on a
        daemon thread, so the caller can still leave and exit."""
        def close_all() -> None:
            self._close_shards()
            self._channel.close()

        closer = threading.Thread(target=close_all, name="ps-client-close", daemon=True)
        closer.start()
        closer.join(timeout)
        if closer.is_alive():
            log.warning("closing the connection to %s did not finish within %g s; giving it up", self.target, timeout)
            return False
        return True

    def _close_shards(self) -> None:
        for link in self._shards:
            link.channel.close()
        self._shards = []
        for pool in (self._pool, self._receiving):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        self._pool = self._receiving = None

    def _use_shards(self, shards: tuple[ShardTarget, ...], numel: int) -> None:
        """Connect to the shard servers named at Join (again after a rejoin: they may have moved)."""
        if tuple(link.target for link in self._shards) == shards and self._own_stop is not None:
            return
        self._close_shards()
        self._own_stop = shards[0].start if shards else numel
        for shard in shards:
            channel = self._open_channel(shard.address)
            self._shards.append(_ShardLink(shard, channel, _push_call(channel, "ParameterShard"),
                                           _pull_call(channel, "ParameterShard")))
        if shards:
            self._pool = ThreadPoolExecutor(max_workers=len(shards), thread_name_prefix="shard")

    def wait_ready(self, timeout: float) -> None:
        """Return once the channel connects; UNAVAILABLE after `timeout` s (worker/transport/reconnect.py: slices)."""
        future = grpc.channel_ready_future(self._channel)
        try:
            future.result(timeout=timeout)
        except grpc.FutureTimeoutError as exc:
            future.cancel()  # no subscription left behind per slice
            raise ServerError("UNAVAILABLE", f"no parameter server answered at {self.target} within {timeout:.0f}s") from exc

    def join(self, name: str, cores: float, timeout: float | None = None, cuda_device: str | None = None,
             max_batch: int = 0) -> Joined:
        """Join; blocks (waiting for the server too) until admitted, or `timeout` seconds.
        `cuda_device`: the UUID of the GPU this worker computes on, None on CPU; `max_batch`: the most
        samples its memory holds (0: no bound of its own)."""
        try:
            ask = JoinAsk(name, cores, cuda_device, max_batch, *self.declared, switch_paths=self.switch_paths)
            request = join_ask_to_proto(ask)
            reply = self._stub.Join(request, wait_for_ready=True, timeout=timeout)
        except grpc.RpcError as exc:
            raise _error(exc) from None
        info = join_from_proto(reply)
        self._secrets[info.worker_id] = info.secret
        try:
            return self._joined(info, max_batch)
        except server_checks.UntrustedReply:  # a member that will never push: leave at once
            with contextlib.suppress(ServerError):
                self.leave(info.worker_id, timeout=CLOSE_TIMEOUT_S)
            raise

    def _joined(self, info: JoinInfo, max_batch: int) -> Joined:
        """The Join reply as a Joined record, checked (worker.transport.server_checks) before a shard is reached."""
        spec = server_checks.job_spec(info.job_json)
        shards = tuple(replace(s, address=self._shard_address(s.address)) for s in info.shards)
        server_checks.shard_ranges([(s.address, s.start, s.stop) for s in shards], info.layout.numel, self.target,
                                   self.allowed_shard_hosts)
        server_checks.batch_size(info.batch_size, info.global_batch or spec.global_batch, max_batch, spec.micro_batch)
        heartbeat_s = server_checks.heartbeat_interval(info.heartbeat_interval_s)
        self._use_shards(shards, info.layout.numel)
        return Joined.of(replace(info, shards=shards, heartbeat_interval_s=heartbeat_s), spec)

    def _shard_address(self, address: str) -> str:
        host, _, port = address.rpartition(":")
        host, _ = reachable_address(host.strip("[]"), 0, self.target)
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def push(self, meta: PushMeta, values: torch.Tensor, out: torch.Tensor) -> StepHeader:
        """Stream `values` up and wait for the reply; its parameters (if it carries any) land in `out`."""
        return self.start_push(meta, values, out)()

    def start_push(self, meta: PushMeta, values: torch.Tensor, out: torch.Tensor) -> Callable[[], StepHeader]:
        """`push`, started: the values go up now, and the returned call waits for the reply (BSP: sent
        when the round closes), so the caller can work in between (the fast path's optimizer step).

        `meta` says what the push is (its kind: "report", with no values, and "snapshot" are the
        --allreduce fast path's) and its step's times; the client adds the secret and the number of
        values each server gets. The times go in the PushEnd that closes the push."""
        meta = replace(meta, num_values=values.numel(), secret=self.secret(meta.worker_id), offsets=False)
        timing = self.last_push = PushTiming()

        def requests(part: torch.Tensor) -> Iterator[bytes]:
            """Serialized chunks of `part` (one server's values): each slice written once, straight into
            its message (bf16/fp16: converted on the way, common.transport.payload.frame_tensor), the
            header (its times 0) on the first; then the end, with the times."""
            frame = push_frame(replace(meta, num_values=part.numel(), times=PushTimes()))
            sent = 0
            for message in frame_tensor(part, meta.wire_dtype, frame, self.chunk_bytes):
                sent += 1
                yield message
            yield push_end_message(sent, meta.times)
            timing.uploaded = time.perf_counter()

        if not self._shards or meta.kind != "values":
            return functools.partial(_finish, self._push(requests(values)), out, timing)
        own = self._own_stop
        assert own is not None and self._pool is not None
        calls = [link.push(requests(values[link.target.start : link.target.stop])) for link in self._shards]
        return functools.partial(self._gather, self._push(requests(values[:own])), calls, out)

    def open_push(self, meta: PushMeta, out: torch.Tensor) -> BucketStream:
        """A push of as many gradient values as `out` holds, sent in buckets, in any order, as they are
        ready (BSP, during backward: worker.paths.overlap); its reply's parameters land in `out`. The
        step's times are not known yet: the stream's end carries them (BucketStream.end)."""
        numel = out.numel()
        header = replace(meta, times=PushTimes(), num_values=0, offsets=True, secret=self.secret(meta.worker_id))
        ranges = [(0, numel if self._own_stop is None else self._own_stop)]
        ranges += [(link.target.start, link.target.stop) for link in self._shards]
        lanes = [Lane(start, stop, header, self.chunk_bytes) for start, stop in ranges]
        calls = [self._push(lanes[0].requests())]
        calls += [link.push(lane.requests()) for link, lane in zip(self._shards, lanes[1:], strict=True)]
        timing = self.last_push = PushTiming()
        lanes[0].timing = timing
        streamed = functools.partial(self._stream_reply, calls[0], calls[1:], out, timing)
        if self._shards:
            return BucketStream(lanes, calls, functools.partial(self._gather, calls[0], calls[1:], out), streamed)
        return BucketStream(lanes, calls, functools.partial(_finish, calls[0], out, timing), streamed)

    def _stream_reply(self, main: Iterator[DataChunk], calls: list[Any], out: torch.Tensor, timing: PushTiming,
                      arrivals: Arrivals) -> StepHeader:
        """The reply's plan as soon as its header (its first chunk) is in; its values (and each shard's range) go on
        arriving into `out` on the client's receiving threads, `arrivals` told as each chunk lands."""
        try:
            first = _first_chunk(main)
            server_checks.reply_length(first.fields.header.num_values, self._own_stop or 0)
        except BaseException as exc:
            for call in [main, *calls]:
                call.cancel()
            if isinstance(exc, grpc.RpcError):
                raise _error(exc) from None
            raise
        timing.replied = time.perf_counter()
        h = first.fields.header
        lanes: list[tuple[Iterator[DataChunk], torch.Tensor, DataChunk | None]] = []
        if h.num_values:
            lanes.append((main, out[: h.num_values], first))
        lanes += [(call, out[link.target.start : link.target.stop], None) for call, link in zip(calls, self._shards, strict=True)]
        numbers = arrivals.begin([(_base(view, out), _base(view, out) + view.numel()) for _, view, _ in lanes])
        if self._receiving is None:
            self._receiving = ThreadPoolExecutor(max_workers=1 + len(self._shards), thread_name_prefix="reply")
        everything = [main, *calls]
        for number, (stream, view, head) in zip(numbers, lanes, strict=True):
            self._receiving.submit(_receive_lane, stream, view, arrivals, number, everything, head)
        return step_header_from_proto(h)

    def _gather(self, main: Iterator[DataChunk], calls: list[Any], out: torch.Tensor) -> StepHeader:
        """--shards: receive the coordinator's reply (the plan, range 0) here and each shard's range
        on the pool at once. If any call fails the others are cancelled and its error raised."""
        assert self._pool is not None and self._own_stop is not None
        futures: list[Future[StepHeader]] = [
            self._pool.submit(_receive, call, out[link.target.start : link.target.stop])
            for call, link in zip(calls, self._shards, strict=True)
        ]
        try:
            plan = _receive(main, out[: self._own_stop])
            for future in futures:
                future.result()
            return plan
        except BaseException as exc:  # an RPC error, or a reply that does not decode: no call is left running
            for call in [main, *calls]:
                call.cancel()
            if isinstance(exc, grpc.RpcError):
                raise _error(exc) from None
            raise

    def pull(self, worker_id: str, out: torch.Tensor, header_only: bool = False, wait_for_batch: bool = False) -> StepHeader:
        """The current plan, and the parameters into `out` unless `header_only`. `wait_for_batch` (a
        parked worker, header only): the server answers once it plans this worker a batch, or the job
        ends, or after a few seconds with the unchanged plan."""
        request = pull_ask_to_proto(PullAsk(worker_id, self.secret(worker_id), header_only=header_only,
                                            wait_for_batch=wait_for_batch))
        if not self._shards or header_only:
            try:
                return _receive(self._pull(request), out)
            except grpc.RpcError as exc:
                raise _error(exc) from None
        calls = [link.pull(request) for link in self._shards]
        return self._gather(self._pull(request), calls, out)

    def pull_optimizer_state(self, worker_id: str, numel: int) -> torch.Tensor | None:
        """--allreduce: the server's optimizer state, `numel` fp32 values (common.params.flat_state), or None when
        its optimizer has not stepped yet, or when the server predates optimizer-state pulls (it sends
        parameters instead, and says nothing of a state: a warning, and the momentum starts at zero)."""
        request = pull_ask_to_proto(PullAsk(worker_id, self.secret(worker_id), optimizer_state=True))
        try:
            stream = self._pull(request)
            first = _first_chunk(stream)
            if not first.fields.header.optimizer_state:
                stream.cancel()
                log.warning("the server sends no optimizer state (an older version): the momentum starts at zero")
                return None
            out = torch.empty(numel)
            header = _receive_into(itertools.chain([first], stream), out)
        except grpc.RpcError as exc:
            raise _error(exc) from None
        return out if header.num_values else None

    def leave(self, worker_id: str, timeout: float = LEAVE_TIMEOUT_S) -> None:
        """Tell the server this worker is going; DEADLINE_EXCEEDED after `timeout` s (a server that is
        reachable but does not answer must not hold up an exit or a rejoin)."""
        try:
            self._stub.Leave(leave_to_proto(Caller(worker_id, self.secret(worker_id))), timeout=timeout)
        except grpc.RpcError as exc:
            raise _error(exc) from None
        self._secrets.pop(worker_id, None)

    def heartbeat(self, worker_id: str) -> Beat:
        try:
            request = heartbeat_to_proto(Caller(worker_id, self.secret(worker_id)))
            return beat_from_proto(self._stub.Heartbeat(request, timeout=10))
        except grpc.RpcError as exc:
            raise _error(exc) from None

    def rendezvous(self, worker_id: str, call: StoreCall) -> StoreAnswer:
        """--allreduce: one call on the group's store as `worker_id` (worker.paths.group_store); the server may
        hold it for `call.wait_s` seconds."""
        request = store_call_to_proto(call, worker_id, self.secret(worker_id))
        try:
            return store_answer_from_proto(self._stub.Rendezvous(request, timeout=call.wait_s + LEAVE_TIMEOUT_S))
        except grpc.RpcError as exc:
            raise _error(exc) from None

    def status(self) -> JobStatus:
        try:
            return job_status_from_proto(self._stub.Status(status_request()))
        except grpc.RpcError as exc:
            raise _error(exc) from None


_PARAMS_CHUNK = PROBE.timed("receive", data_view_parser(ps_pb2.ParamsChunk))  # replies' data as views of the received bytes


def _push_call(channel: grpc.Channel, service: str) -> PushCall:
    """`service`'s Push, taking serialized PushChunks (common/transport/serialized.py) as well as messages."""
    full_name = ps_pb2.DESCRIPTOR.services_by_name[service].full_name
    call = channel.stream_stream(f"/{full_name}/Push", request_serializer=passthrough(ps_pb2.PushChunk.SerializeToString),
                                 response_deserializer=_PARAMS_CHUNK)
    return PROBE.fed("push_send", call)


def _pull_call(channel: grpc.Channel, service: str) -> grpc.UnaryStreamMultiCallable:
    """`service`'s Pull, its ParamsChunks parsed as Push's are."""
    full_name = ps_pb2.DESCRIPTOR.services_by_name[service].full_name
    return channel.unary_stream(f"/{full_name}/Pull", request_serializer=ps_pb2.PullRequest.SerializeToString,
                                response_deserializer=_PARAMS_CHUNK)


def _finish(call: Iterator[DataChunk], out: torch.Tensor, timing: PushTiming | None = None) -> StepHeader:
    """The reply of a call already started (its parameters into `out`), a ServerError if it failed."""
    try:
        return _receive(call, out, timing)
    except grpc.RpcError as exc:
        raise _error(exc) from None


def _receive(stream: Iterator[DataChunk], out: torch.Tensor, timing: PushTiming | None = None) -> StepHeader:
    return step_header_from_proto(_receive_into(stream, out, timing))


def _base(view: torch.Tensor, whole: torch.Tensor) -> int:
    """Where `view` (a slice of the 1-D `whole`) starts in it."""
    return (view.data_ptr() - whole.data_ptr()) // whole.element_size()


def _receive_lane(stream: Iterator[DataChunk], out: torch.Tensor, arrivals: Arrivals, lane: int, calls: list[Any],
                  first: DataChunk | None = None) -> None:
    """One server's part of a streamed reply into `out` (its first chunk already read: `first`),
    `arrivals` told after every chunk. On failure every call of the reply is cancelled and the error
    handed to `arrivals` (the step that waits for it drops its gradient)."""
    error: BaseException | None = None
    try:
        first = _first_chunk(stream) if first is None else first
        h = first.fields.header
        with _checked_reply(), PROBE.part("receive"):
            receiver = FlatReceiver(out, h.num_values, h.wire_dtype, check_finite=False)
            for chunk in itertools.chain([first], stream):
                with PROBE.part("copy"):
                    receiver.feed(chunk.fields.seq, chunk.data)
                arrivals.advance(lane, receiver.filled)
            server_checks.finite_values(receiver.finish(check_finite=False))
    except grpc.RpcError as exc:
        error = _error(exc)
    except BaseException as exc:  # noqa: BLE001 (a reply that does not decode: the step hears of it)
        error = exc
    if error is not None:
        for call in calls:
            call.cancel()
    arrivals.end(lane, error)


def _first_chunk(stream: Iterator[DataChunk]) -> DataChunk:
    """A reply's first chunk (its header); a ServerError if the stream ends before it."""
    first = next(stream, None)
    if first is None:
        raise ServerError("INTERNAL", "the server's reply ended before its header")
    return first


def _receive_into(stream: Iterator[DataChunk], out: torch.Tensor, timing: PushTiming | None = None) -> ps_pb2.ParamsHeader:
    """A reply's header; its values (if it carries any: header.num_values) land in `out`."""
    first = _first_chunk(stream)
    if timing is not None:
        timing.replied = time.perf_counter()
    h: ps_pb2.ParamsHeader = first.fields.header
    with _checked_reply(), PROBE.part("receive"):
        receiver = FlatReceiver(out if h.num_values else _NO_VALUES, h.num_values, h.wire_dtype, check_finite=False)
        for chunk in itertools.chain([first], stream):
            with PROBE.part("copy"):
                receiver.feed(chunk.fields.seq, chunk.data)
        server_checks.finite_values(receiver.finish(check_finite=False))
    return h


@contextlib.contextmanager
def _checked_reply() -> Iterator[None]:
    """A reply's values that the receiver refuses (the wrong length, out of order, NaN or infinity:
    worker.transport.server_checks) are an UntrustedReply: the worker leaves rather than train on them."""
    try:
        yield
    except InvalidArgument as exc:
        raise server_checks.UntrustedReply(f"the server's reply is refused: {exc}") from None

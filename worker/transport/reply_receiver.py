"""A server's reply read into the worker's flat fp32 buffer: its header first, then its values chunk by
chunk, refused (an UntrustedReply) when they are the wrong length, out of order or not finite. One
receiver serves a reply read whole before the step goes on and one server's part of a reply streamed
on a receiving thread while the next forward runs."""

from __future__ import annotations

import contextlib
import functools
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import torch

from protos import ps_pb2
from common.errors import InvalidArgument
from common.transport.messages import StepHeader
from common.transport.proto_convert import step_header_from_proto
from common.transport.serialized import DataChunk
from common.transport.wire import FlatReceiver
import worker.transport.server_checks as server_checks
from worker.probes.cpu_parts import PROBE
from worker.transport.arrivals import Arrivals
from worker.transport.bucket_stream import PushTiming
from worker.transport.server_error import ServerError, server_error

_NO_VALUES = torch.empty(0)


def first_chunk(stream: Iterator[DataChunk]) -> DataChunk:
    """A reply's first chunk (its header); a ServerError if the stream ends before it, an UntrustedReply
    if it has none."""
    first = next(stream, None)
    if first is None:
        raise ServerError("INTERNAL", "the server's reply ended before its header")
    server_checks.header_place(0, first.fields.HasField("header"))
    return first


def receive_into(stream: Iterator[DataChunk], out: torch.Tensor, *, first: DataChunk | None = None,
                 timing: PushTiming | None = None, filled: Callable[[int], None] | None = None,
                 values_optional: bool = True, optimizer_state: bool = False, shard: bool = False) -> ps_pb2.ParamsHeader:
    """A reply's header; its values land in `out`. `first`: its first chunk, already read; `timing`: told
    when the header is in; `filled`: told how many values are in after every chunk. `values_optional`:
    a reply without values (header.num_values 0) leaves `out` alone, where otherwise it must fill it
    unless it ends the job (server_checks.values_sent).
    `optimizer_state`: the values asked for are the optimizer's state, else parameters (the header
    must say the same: server_checks.payload). `shard`: the reply is a shard server's, which ends no job."""
    first = first_chunk(stream) if first is None else first
    if timing is not None:
        timing.replied = time.perf_counter()
    h: ps_pb2.ParamsHeader = first.fields.header
    server_checks.payload(h.optimizer_state, optimizer_state)
    server_checks.values_sent(h.num_values, h.done, required=not values_optional, shard=shard)
    with _checked_reply(), PROBE.part("receive"):
        buffer = _NO_VALUES if not h.num_values else out
        receiver = FlatReceiver(buffer, h.num_values, h.wire_dtype, check_finite=False)
        for index, chunk in enumerate(itertools.chain([first], stream)):
            if index:
                server_checks.header_place(index, chunk.fields.HasField("header"))
            with PROBE.part("copy"):
                receiver.feed(chunk.fields.seq, chunk.data)
            if filled is not None:
                filled(receiver.filled)
        server_checks.finite_values(receiver.finish(check_finite=False))
    return h


def receive(stream: Iterator[DataChunk], out: torch.Tensor, timing: PushTiming | None = None,
            values_optional: bool = True, shard: bool = False) -> StepHeader:
    """A reply's plan; its parameters land in `out` (`values_optional`: if it carries any; `shard`: a shard server's)."""
    return step_header_from_proto(receive_into(stream, out, timing=timing, values_optional=values_optional,
                                               shard=shard))


def finish(call: Iterator[DataChunk], out: torch.Tensor, timing: PushTiming | None = None,
           values_optional: bool = True) -> StepHeader:
    """The reply of a call already started (its parameters into `out`; `values_optional`: if it
    carries any), a ServerError if it failed."""
    try:
        return receive(call, out, timing, values_optional)
    except grpc.RpcError as exc:
        raise server_error(exc) from None


def receive_lane(stream: Iterator[DataChunk], out: torch.Tensor, arrivals: Arrivals, lane: int, calls: list[Any],
                 first: DataChunk | None = None, shard: bool = False) -> None:
    """One server's part of a streamed reply into `out` (its first chunk already read: `first`; `shard`: a shard server's),
    `arrivals` told after every chunk. On failure every call of the reply is cancelled and the error
    handed to `arrivals` (the step that waits for it drops its gradient)."""
    error: BaseException | None = None
    try:
        receive_into(stream, out, first=first, filled=functools.partial(arrivals.advance, lane), values_optional=False,
                     shard=shard)
    except grpc.RpcError as exc:
        error = server_error(exc)
    except BaseException as exc:  # noqa: BLE001 (a reply that does not decode: the step hears of it)
        error = exc
    if error is not None:
        for call in calls:
            call.cancel()
    arrivals.end(lane, error)


@contextlib.contextmanager
def _checked_reply() -> Iterator[None]:
    """A reply's values that the receiver refuses (the wrong length, out of order, NaN or infinity:
    worker.transport.server_checks) are an UntrustedReply: the worker leaves rather than train on them."""
    try:
        yield
    except InvalidArgument as exc:
        raise server_checks.UntrustedReply(f"the server's reply is refused: {exc}") from None

"""The servers one push or pull reaches: the coordinator, and with --shards each shard server named at
Join, one contiguous range of the values after the coordinator's. It holds the shards' links and the
threads that receive their ranges, and gathers a reply whole or streams it into the caller's buffer."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
import torch

from common.ops import address
from common.transport.messages import ShardTarget, StepHeader
from common.transport.proto_convert import step_header_from_proto
from common.transport.serialized import DataChunk
import worker.transport.server_checks as server_checks
from worker.transport.arrivals import Arrivals
from worker.transport.bucket_stream import PushTiming
from worker.transport.reply_receiver import first_chunk, receive, receive_lane
from worker.transport.server_error import server_error
from worker.transport.stream_calls import PushCall, pull_call, push_call

def reachable_address(host: str, port: int, server_target: str) -> tuple[str, int]:
    """Where to reach a service the server advertises (a shard): a wildcard host (bound
    to all interfaces) means the host of the server's own address."""
    if host in address.WILDCARD_HOSTS:
        host = address.host_of(server_target)
    return host, port


def shard_address(advertised: str, server_target: str) -> str:
    """A shard's advertised `host:port` (checked: server_checks.shard_addresses) as this worker reaches
    it (reachable_address)."""
    host, port = address.split(advertised, empty_host=True)
    return address.join(*reachable_address(host, port, server_target))


@dataclass(frozen=True)
class ShardLink:
    """An open connection to one shard server: its range, channel, and Push and Pull callables."""

    target: ShardTarget
    channel: grpc.Channel
    push: PushCall
    pull: grpc.UnaryStreamMultiCallable


class ShardFanOut:
    """The coordinator's range [0, own_stop) and the shards' links, with the pools that receive replies:
    one thread per shard for a gathered reply, one per server for a streamed one."""

    def __init__(self, open_shard_channel: Callable[[str], grpc.Channel]) -> None:
        """`open_shard_channel`: a channel to an address, with the client's token and TLS files (the same for every shard)."""
        self._open_channel = open_shard_channel
        self.own_stop: int | None = None  # None until Join: the coordinator holds values [0, own_stop)
        self.links: list[ShardLink] = []
        self._pool: ThreadPoolExecutor | None = None
        self._receiving: ThreadPoolExecutor | None = None  # streamed replies' values (one thread per server)

    def use(self, shards: tuple[ShardTarget, ...], numel: int) -> None:
        """Connect to the shard servers named at Join (again after a rejoin: they may have moved)."""
        if tuple(link.target for link in self.links) == shards and self.own_stop is not None:
            return
        self.close()
        self.own_stop = shards[0].start if shards else numel
        for shard in shards:
            channel = self._open_channel(shard.address)
            self.links.append(ShardLink(shard, channel, push_call(channel, "ParameterShard"),
                                        pull_call(channel, "ParameterShard")))
        if shards:
            self._pool = ThreadPoolExecutor(max_workers=len(shards), thread_name_prefix="shard")

    def close(self) -> None:
        """Close the shards' channels and stop the receiving threads."""
        for link in self.links:
            link.channel.close()
        self.links = []
        for pool in (self._pool, self._receiving):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        self._pool = self._receiving = None

    def gather(self, main: Iterator[DataChunk], calls: list[Any], out: torch.Tensor,
               values_optional: bool = True) -> StepHeader:
        """--shards: receive the coordinator's reply (the plan, range 0) here and each shard's range
        on the pool at once (`values_optional` False: a Pull of the parameters or a push of values, every range carries its values). If any call fails the others are cancelled and its error raised, unless
        the coordinator's reply said the job is done: then the plan is returned, with the ranges that
        did not come left as they were. A stop drops the open round (ps/rounds/parts.py), no shard
        commits it, and the shards' calls fail as the server stops them; the ranges left hold the
        last committed round, as range 0 does."""
        assert self._pool is not None and self.own_stop is not None
        futures: list[Future[StepHeader]] = [
            self._pool.submit(receive, call, out[link.target.start : link.target.stop], None, values_optional, True)
            for call, link in zip(calls, self.links, strict=True)
        ]
        plan: StepHeader | None = None
        try:
            plan = receive(main, out[: self.own_stop], values_optional=values_optional)
            for future in futures:
                future.result()
            return plan
        except BaseException as exc:  # an RPC error, or a reply that does not decode: no call is left running
            _cancel([main, *calls])
            if isinstance(exc, grpc.RpcError):
                if plan is not None and plan.done:
                    return plan
                raise server_error(exc) from None
            raise

    def stream_reply(self, main: Iterator[DataChunk], calls: list[Any], out: torch.Tensor, timing: PushTiming,
                     arrivals: Arrivals) -> StepHeader:
        """The reply's plan as soon as its header (its first chunk) is in; its values (and each shard's range) go on
        arriving into `out` on the receiving threads, `arrivals` told as each chunk lands. A bucketed push's
        reply: the PS path's, which carries the parameters unless it ends the job (server_checks.values_sent)."""
        try:
            first = first_chunk(main)
            server_checks.reply_length(first.fields.header.num_values, self.own_stop or 0)
            server_checks.values_sent(first.fields.header.num_values, first.fields.header.done, required=True)
        except BaseException as exc:
            _cancel([main, *calls])
            if isinstance(exc, grpc.RpcError):
                raise server_error(exc) from None
            raise
        timing.replied = time.perf_counter()
        h = first.fields.header
        lanes: list[tuple[Iterator[DataChunk], torch.Tensor, DataChunk | None]] = []
        if h.num_values:
            lanes.append((main, out[: h.num_values], first))
        lanes += [(call, out[link.target.start : link.target.stop], None) for call, link in zip(calls, self.links, strict=True)]
        numbers = arrivals.begin([(_base(view, out), _base(view, out) + view.numel()) for _, view, _ in lanes])
        if self._receiving is None:
            self._receiving = ThreadPoolExecutor(max_workers=1 + len(self.links), thread_name_prefix="reply")
        everything = [main, *calls]
        for number, (stream, view, head) in zip(numbers, lanes, strict=True):
            self._receiving.submit(receive_lane, stream, view, arrivals, number, everything, head, stream is not main)
        return step_header_from_proto(h)


def _cancel(calls: list[Any]) -> None:
    for call in calls:
        call.cancel()


def _base(view: torch.Tensor, whole: torch.Tensor) -> int:
    """Where `view` (a slice of the 1-D `whole`) starts in it."""
    return (view.data_ptr() - whole.data_ptr()) // whole.element_size()

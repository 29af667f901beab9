"""The worker's pushes and pulls of parameters (client.py's PSClient makes them): a push streamed up
whole (`push`, `start_push`) or in buckets as backward makes them (`open_push`), a probe's to the
coordinator alone (`push_probe`), and a pull of the plan
and the parameters, each over the coordinator and any shard servers (worker.transport.shard_fanout),
with the reply's parameters decoded straight into a caller-owned fp32 buffer
(worker.transport.reply_receiver) and its deadlines watched (worker.transport.watchdog).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import grpc
import torch

from common.transport.messages import PullAsk, PushMeta, PushTimes, StepHeader
from common.transport.proto_convert import pull_ask_to_proto
from common.transport.serialized import DataChunk
from worker.transport.bucket_stream import BucketStream, Lane, PushTiming
from worker.transport.call_bounds import MIN_VALUES_RATE, CallBounds
from worker.transport.ordered_push import ordered_push
from worker.transport.reply_receiver import finish, receive
from worker.transport.server_error import server_error
from worker.transport.shard_fanout import ShardFanOut
from worker.transport.stream_calls import PushCall
from worker.transport.watchdog import Watchdog, Watched


VALUES_BOUND = f"--timeout + 1 s per {MIN_VALUES_RATE // 1024} KiB of values"


def carries_values(chunk: DataChunk) -> bool:
    """A reply's chunk is progress only with values in it: empty or padding-only chunks restart no pause bound."""
    return len(chunk.data) > 0


class PushPull:
    """The pushes and pulls over the coordinator's stream calls (`_push`, `_pull`) and the shards'
    (`_fanout`), each call's deadlines from `bounds`."""

    target: str
    bounds: CallBounds
    chunk_bytes: int
    last_push: PushTiming
    _watchdog: Watchdog
    _fanout: ShardFanOut
    _push: PushCall
    _pull: grpc.UnaryStreamMultiCallable

    def secret(self, worker_id: str) -> str:
        """The secret to send with the calls naming `worker_id`."""
        raise NotImplementedError

    def push(self, meta: PushMeta, values: torch.Tensor, out: torch.Tensor) -> StepHeader:
        """Stream `values` up and wait for the reply; its parameters (if it carries any) land in `out`."""
        return self.start_push(meta, values, out)()

    def start_push(self, meta: PushMeta, values: torch.Tensor, out: torch.Tensor) -> Callable[[], StepHeader]:
        """`push`, started: the values go up now, and the returned call waits for the reply (BSP: sent
        when the round closes), so the caller can work in between (the fast path's optimizer step).

        `meta` says what the push is (its kind: "report", with no values, and "snapshot" are the
        --allreduce fast path's) and its step's times; the client adds the secret and the number of
        values each server gets. The times go in the PushEnd that closes the push. The reply to values
        (the PS path's) carries the parameters unless it ends the job; a report's or a snapshot's may be
        a header alone (ps/rounds/path_trial.py: the switch back waits for a snapshot)."""
        meta = replace(meta, num_values=values.numel(), secret=self.secret(meta.worker_id), offsets=False)
        timing = self.last_push = PushTiming()
        fanout = self._fanout
        if not fanout.links or meta.kind != "values":
            main = self._push_reply(self._push(ordered_push(meta, values, self.chunk_bytes, timing)))
            return functools.partial(finish, main, out, timing, values_optional=meta.kind != "values")
        own = fanout.own_stop
        assert own is not None
        calls = [self._push_reply(link.push(ordered_push(meta, values[link.target.start : link.target.stop],
                                                         self.chunk_bytes, timing)), link.target.address)
                 for link in fanout.links]
        main = self._push_reply(self._push(ordered_push(meta, values[:own], self.chunk_bytes, timing)))
        return functools.partial(fanout.gather, main, calls, out, values_optional=False)

    def push_probe(self, meta: PushMeta, values: torch.Tensor, out: torch.Tensor) -> StepHeader:
        """A probe (ps.rounds.probation): every value of `values` to the coordinator alone, whatever the
        job's path; its reply comes once this worker is in the plan. On the fast path (the reply names
        this worker's group) a header alone is the reply: the group holds the parameters. On the PS
        path the reply may carry them, or not (--allreduce auto's switch back answers without them
        until a snapshot came), and with --shards it carries the coordinator's range only: unless it
        carries them all, the whole model is pulled after it (a Pull must carry them:
        server_checks.values_sent). The round it names cannot close before this worker's next push,
        so every range is of that round."""
        meta = replace(meta, num_values=values.numel(), secret=self.secret(meta.worker_id), offsets=False)
        timing = self.last_push = PushTiming()
        main = self._push_reply(self._push(ordered_push(meta, values, self.chunk_bytes, timing)))
        own = self._fanout.own_stop if self._fanout.links else None
        plan = finish(main, out if own is None else out[:own], timing)
        if plan.done or plan.group.world_size or (own is None and plan.num_values):
            return plan
        return self.pull(meta.worker_id, out)

    def open_push(self, meta: PushMeta, out: torch.Tensor) -> BucketStream:
        """A push of as many gradient values as `out` holds, sent in buckets, in any order, as they are
        ready (BSP, during backward: worker.paths.overlap); its reply's parameters land in `out`. The
        step's times are not known yet: the stream's end carries them (BucketStream.end). Its reply
        carries the parameters unless it ends the job, as a whole push's of values (`start_push`)."""
        numel = out.numel()
        header = replace(meta, times=PushTimes(), num_values=0, offsets=True, secret=self.secret(meta.worker_id))
        fanout = self._fanout
        ranges = [(0, numel if fanout.own_stop is None else fanout.own_stop)]
        ranges += [(link.target.start, link.target.stop) for link in fanout.links]
        lanes = [Lane(start, stop, header, self.chunk_bytes) for start, stop in ranges]
        calls = [self._push_reply(self._push(lanes[0].requests()))]
        calls += [self._push_reply(link.push(lane.requests()), link.target.address)
                  for link, lane in zip(fanout.links, lanes[1:], strict=True)]
        timing = self.last_push = PushTiming()
        lanes[0].timing = timing
        streamed = functools.partial(fanout.stream_reply, calls[0], calls[1:], out, timing)
        if fanout.links:
            return BucketStream(lanes, calls, functools.partial(fanout.gather, calls[0], calls[1:], out,
                                                                values_optional=False), streamed)
        return BucketStream(lanes, calls, functools.partial(finish, calls[0], out, timing, values_optional=False),
                            streamed)

    def pull(self, worker_id: str, out: torch.Tensor, header_only: bool = False, wait_for_batch: bool = False) -> StepHeader:
        """The current plan, and the parameters into `out` unless `header_only` (a reply without them is
        refused unless it ends the job: server_checks.values_sent). `wait_for_batch` (a
        parked worker, header only): the server answers once it plans this worker a batch, or the job
        ends, or after a few seconds with the unchanged plan."""
        request = pull_ask_to_proto(PullAsk(worker_id, self.secret(worker_id), header_only=header_only,
                                            wait_for_batch=wait_for_batch))
        main = self._pull_reply(self._pull(request), long_poll=wait_for_batch)
        if not self._fanout.links or header_only:
            try:
                return receive(main, out, values_optional=header_only)
            except grpc.RpcError as exc:
                raise server_error(exc) from None
        calls = [self._pull_reply(link.pull(request), server=link.target.address) for link in self._fanout.links]
        return self._fanout.gather(main, calls, out, values_optional=False)

    def _push_reply(self, call: Any, server: str | None = None) -> Watched[DataChunk]:
        """A push's reply from the coordinator (`server` None: its header times the rounds) or the
        shard at `server`: the header within the round's bound, the values with no pause over --timeout."""
        b = self.bounds
        return Watched(call, self._watchdog, what=f"the reply to a push from {server or self.target}",
                       first_s=b.reply_s(), idle_s=b.call_s,
                       first_bound=f"--timeout {b.timeout_s:g} s + {b.round_s():.0f} s for its round to close",
                       on_first=(lambda: b.replied(time.monotonic())) if server is None else None, progress=carries_values,
                       rest_s=lambda header: b.values_s(header.fields.header.num_values), rest_bound=VALUES_BOUND)

    def _pull_reply(self, call: Any, long_poll: bool = False, server: str | None = None) -> Watched[DataChunk]:
        """A Pull's reply from the coordinator or the shard at `server`: the header within --timeout (a
        parked worker's `long_poll`: the server's few seconds more), the values with no pause over it."""
        b = self.bounds
        return Watched(call, self._watchdog, what=f"a Pull from {server or self.target}", idle_s=b.call_s,
                       first_s=b.long_poll_s if long_poll else b.call_s,
                       first_bound="--timeout + the long poll's 5 s" if long_poll else "--timeout", progress=carries_values,
                       rest_s=lambda header: b.values_s(header.fields.header.num_values), rest_bound=VALUES_BOUND)

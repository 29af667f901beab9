"""The bucketed push on the wire (worker.paths.overlap's stream): each server's part of it as serialized
chunks with their offsets, fed from a queue while backward runs, and when a push's upload ended and
its reply began (`PushTiming`). The client (worker.transport.client) opens the calls and reads the replies."""

from __future__ import annotations

import functools
import queue
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch

from common.transport.chunk_frames import offset_frame, push_end_message, push_header_message
from common.transport.messages import PushMeta, PushTimes, StepHeader
from common.transport.payload import frame_tensor
from common.transport.wire import torch_dtype
from worker.transport.arrivals import Arrivals


class Lane:
    """One server's part of a bucketed push (the coordinator's range, or a shard's): the chunks of
    the values it is handed, with their offsets in its range, then the end."""

    def __init__(self, start: int, stop: int, meta: PushMeta, chunk_bytes: int) -> None:
        """`meta`: the push's header (with offsets), its num_values set here to this lane's range."""
        self.start, self.stop = start, stop
        self.meta = replace(meta, num_values=stop - start)
        self.wire_dtype = meta.wire_dtype
        self.chunk_bytes = chunk_bytes
        self.timing: PushTiming | None = None
        self.queue: queue.SimpleQueue[tuple[int, torch.Tensor] | PushTimes | None] = queue.SimpleQueue()

    def requests(self) -> Iterator[bytes]:
        """The serialized chunks, as the values arrive on the queue (gRPC's thread iterates this)."""
        seq = 0
        yield push_header_message(self.meta)
        per_chunk = max(1, self.chunk_bytes // torch.empty(0, dtype=torch_dtype(self.wire_dtype)).element_size())
        while True:
            item = self.queue.get()
            if item is None:  # cancelled
                return
            if isinstance(item, PushTimes):
                yield push_end_message(seq + 1, item)
                if self.timing is not None:
                    self.timing.uploaded = time.perf_counter()
                return
            offset, values = item
            for message in frame_tensor(values, self.wire_dtype, offset_frame(seq + 1, offset, per_chunk), self.chunk_bytes):
                seq += 1
                yield message


class BucketStream:
    """A push whose buckets go out as they are ready (worker.paths.overlap.BucketPush): `send` each range
    once, then `end` with the step's times; its reply is the returned call's."""

    def __init__(self, lanes: list[Lane], calls: list[Any], reply: Callable[[], StepHeader],
                 streamed: Callable[[Arrivals], StepHeader] | None = None) -> None:
        self._lanes = lanes
        self._calls = calls
        self._reply = reply
        self._streamed = streamed

    def send(self, offset: int, values: torch.Tensor) -> None:
        """Values [offset, offset + len) of the flat vector, split over the servers' ranges."""
        stop = offset + values.numel()
        for lane in self._lanes:
            lo, hi = max(offset, lane.start), min(stop, lane.stop)
            if lo < hi:
                lane.queue.put((lo - lane.start, values[lo - offset : hi - offset]))

    def end(self, times: PushTimes, arrivals: Arrivals | None = None) -> Callable[[], StepHeader]:
        """Close the push with the step's times (PushEnd); the call that waits for the reply (with
        `arrivals`: for its header, the parameters streaming in after it, worker.paths.forward_order)."""
        for lane in self._lanes:
            lane.queue.put(times)
        if arrivals is not None and self._streamed is not None:
            return functools.partial(self._streamed, arrivals)
        return self._reply

    def cancel(self) -> None:
        """Give the push up: the servers drop what they received of it."""
        for lane in self._lanes:
            lane.queue.put(None)
        for call in self._calls:
            call.cancel()


@dataclass
class PushTiming:
    """When a push's last chunk went to gRPC and its reply's first chunk arrived (perf_counter
    seconds; 0 until then): the worker's own upload ends and its download starts, waiting between."""

    uploaded: float = 0.0
    replied: float = 0.0

"""Gradient push during backward: buckets of the flat gradient streamed as backward produces them.

Each parameter gets a post-accumulate-grad hook. Backward runs the model's last layers first, so the
parameters are grouped, from the last one back, into buckets of consecutive values (ranges of the
flat vector, about BUCKET_VALUES each). When every parameter of a bucket has its gradient, the hook
copies them into the flat gradient buffer and hands the range to the push stream (worker.client:
BucketStream), which frames and sends it on gRPC's thread while backward goes on. At `finish` (the
session's step(), backward done) the buckets whose parameters never got a gradient (unused in the
forward, or None) are sent as zeros, as the serial path's flatten_grads does, so no round waits on
them; the stream's end then carries the step's times.

Exactness: the server receives the whole gradient before it aggregates (the receiver places each
bucket at its offset), so the step equals the serial path's bit for bit. A gradient that changed
after its bucket went out (a second backward before step(), a loop that clips or edits gradients
between backward and step()) is caught at `finish`: the stream is cancelled (the server drops it,
nothing of it applied) and the caller pushes the whole gradient serially.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import nn

from common.transport.wire import CHUNK_BYTES
import worker.cpu_parts as cpu_parts

BUCKET_VALUES = CHUNK_BYTES // 4
"""Values per bucket (at least: a parameter larger than this is a bucket of its own): one fp32 wire chunk."""


class Stream(Protocol):
    """What the buckets are sent on (worker.client.BucketStream)."""

    def send(self, offset: int, values: torch.Tensor) -> None: ...

    def end(self, compute_ms: float, exposed_ms: float, own_exposed_ms: float) -> Callable[[], Any]: ...

    def cancel(self) -> None: ...


class Bucket:
    """Consecutive parameters: their range [start, stop) of the flat vector and their indices."""

    def __init__(self, members: list[int], start: int, stop: int) -> None:
        self.members = members
        self.start = start
        self.stop = stop


def plan_buckets(sizes: list[int], bucket_values: int = BUCKET_VALUES) -> list[Bucket]:
    """Buckets of the parameters with these sizes (the flat layout's order), from the last parameter
    back (the order backward produces gradients in), each closed once it holds `bucket_values`."""
    offsets = [0]
    for n in sizes:
        offsets.append(offsets[-1] + n)
    buckets: list[Bucket] = []
    members: list[int] = []
    held = 0
    for i in reversed(range(len(sizes))):
        members.append(i)
        held += sizes[i]
        if held >= bucket_values or i == 0:
            first, last = members[-1], members[0]
            buckets.append(Bucket(sorted(members), offsets[first], offsets[last + 1]))
            members, held = [], 0
    return buckets


class BucketPush:
    """The hooks and the state of one step's bucketed push."""

    def __init__(self, model: nn.Module, grads: torch.Tensor, bucket_values: int | None = None) -> None:
        self._params = list(model.parameters())
        self._grads = grads
        sizes = [p.numel() for p in self._params]
        self._offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        self.buckets = plan_buckets(sizes, BUCKET_VALUES if bucket_values is None else bucket_values)
        self.streamed = 0  # steps whose push went out in buckets
        self.fallbacks = 0  # steps whose buckets were cancelled for a gradient that changed (pushed whole)
        self._bucket_of = {i: k for k, b in enumerate(self.buckets) for i in b.members}
        self._lock = threading.Lock()
        self._open: Callable[[], Stream] | None = None  # armed: opens this step's stream
        self._stream: Stream | None = None
        self._counted: set[int] = set()
        self._missing: list[int] = [len(b.members) for b in self.buckets]
        self._sent: list[bool] = [False] * len(self.buckets)
        self._spoiled = False
        self._handles = [p.register_post_accumulate_grad_hook(self._hook(i)) for i, p in enumerate(self._params)]

    def arm(self, open_stream: Callable[[], Stream]) -> None:
        """A step's compute begins: its gradients go to the stream `open_stream` opens at the first
        bucket. A stream of an earlier step still armed (no step() came) is cancelled."""
        with self._lock:
            if self._stream is not None:
                self._stream.cancel()
            self._open, self._stream = open_stream, None
            self._counted.clear()
            self._missing = [len(b.members) for b in self.buckets]
            self._sent = [False] * len(self.buckets)
            self._spoiled = False

    def disarm(self) -> None:
        """No step in progress (the session closes, or pushes serially): cancel what is in flight."""
        with self._lock:
            if self._stream is not None:
                self._stream.cancel()
            self._open, self._stream = None, None

    def _hook(self, index: int) -> Callable[[torch.Tensor], None]:
        def ready(param: torch.Tensor) -> None:
            self._ready(index, param)

        return ready

    def _ready(self, index: int, param: torch.Tensor) -> None:
        with cpu_parts.part("push_copy"), self._lock:
            if self._open is None or self._spoiled:
                return
            if index in self._counted:  # a second backward before step(): what went out is stale
                self._spoiled = True
                return
            self._counted.add(index)
            self._copy(index)
            k = self._bucket_of[index]
            self._missing[k] -= 1
            if self._missing[k] == 0:
                self._send(k)

    def _copy(self, index: int) -> None:
        p = self._params[index]
        start = self._offsets[index]
        out = self._grads[start : start + p.numel()]
        if p.grad is None:
            out.zero_()
        else:
            out.copy_(p.grad.detach().reshape(-1))

    def _send(self, k: int) -> None:
        if self._stream is None:
            assert self._open is not None
            self._stream = self._open()
        bucket = self.buckets[k]
        self._stream.send(bucket.start, self._grads[bucket.start : bucket.stop])
        self._sent[k] = True

    def finish(self) -> Stream | None:
        """Backward is done: send the buckets still held (parameters without a gradient: zeros) and
        hand over the stream, every value sent once; None (and the stream cancelled) if a gradient
        changed after its bucket went out: the caller pushes the whole gradient instead."""
        with self._lock:
            if self._open is None:
                return None
            with cpu_parts.part("push_check"):
                stale = self._spoiled or any(
                    self._changed(i) for k, bucket in enumerate(self.buckets) if self._sent[k] for i in bucket.members)
            if stale:
                if self._stream is not None:
                    self._stream.cancel()
                self._open, self._stream = None, None
                self.fallbacks += 1
                return None
            with cpu_parts.part("push_copy"):
                for k, bucket in enumerate(self.buckets):
                    if not self._sent[k]:
                        for i in bucket.members:
                            if i not in self._counted:
                                self._copy(i)
                        self._send(k)
            stream = self._stream
            self._open, self._stream = None, None
            self.streamed += 1
            return stream

    def _changed(self, index: int) -> bool:
        """Whether parameter `index`'s gradient differs from what its bucket sent."""
        p = self._params[index]
        start = self._offsets[index]
        sent = self._grads[start : start + p.numel()]
        if p.grad is None:
            return bool(sent.any())
        return not torch.equal(sent, p.grad.detach().reshape(-1).to(sent.device, sent.dtype))

    def remove(self) -> None:
        """Take the hooks off the model."""
        self.disarm()
        for handle in self._handles:
            handle.remove()

"""Gradient push during backward: buckets of the flat gradient streamed as backward produces them.

Each parameter gets a post-accumulate-grad hook. Backward runs the model's last layers first, so the
parameters are grouped, from the last one back, into buckets of consecutive values (ranges of the
flat vector, about BUCKET_VALUES each). When every parameter of a bucket has its gradient, the hook
hands the bucket to the push stream (worker.transport.bucket_stream.BucketStream), which frames and
sends it on gRPC's thread while backward goes on: a large gradient as it is (the framing's write into the
message is its only copy), the small ones copied into the flat gradient buffer and sent as ranges of it. At `finish` (the
session's step(), backward done) the buckets whose parameters never got a gradient (unused in the
forward, or None) are sent as zeros, as the serial path's flatten_grads does, so no round waits on
them; the stream's end then carries the step's times.

Exactness: the server receives the whole gradient before it aggregates (the receiver places each
bucket at its offset), so the step equals the serial path's bit for bit. A gradient that changed
after its bucket went out (a second backward before step(), a loop that clips or edits gradients
between backward and step()) is caught at `finish`: the stream is cancelled (the server drops it,
nothing of it applied) and the caller pushes the whole gradient serially.

A change is seen by the gradient's identity and its version counter, which every in-place op bumps
(clip_grad_norm_, mul_ under no_grad, a view's write): a check of a few integers, where comparing the
values costs a read of the gradient and of the buffer (about 3 ms a step at 5.6M parameters on one
core). An edit through `.data` keeps the version; so the session's first streamed step also compares
the values, and a loop found editing that way is compared on every step from then on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

import torch
from torch import nn

from common.transport.wire import CHUNK_BYTES
from common.transport.messages import PushTimes, StepHeader
from worker.probes.cpu_parts import PROBE
from worker.transport.arrivals import Arrivals

BUCKET_VALUES = CHUNK_BYTES // 4
"""Values per bucket (at least: a parameter larger than this is a bucket of its own): one fp32 wire chunk."""
DIRECT_VALUES = BUCKET_VALUES // 4
"""A gradient of at least this many values is framed straight from its own memory, not copied into
the flat buffer first (a smaller one is copied: one message the less)."""


class Stream(Protocol):
    """What the buckets are sent on (worker.transport.bucket_stream.BucketStream, opened by the client)."""

    def send(self, offset: int, values: torch.Tensor) -> None: ...

    def end(self, times: PushTimes, arrivals: Arrivals | None = None) -> Callable[[], StepHeader]: ...

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
        self.sent_in_place = 0  # gradients framed from their own memory, not copied into the flat buffer
        self._bucket_of = {i: k for k, b in enumerate(self.buckets) for i in b.members}
        self._lock = threading.Lock()
        self._open: Callable[[], Stream] | None = None  # armed: opens this step's stream
        self._stream: Stream | None = None
        self._counted: set[int] = set()
        self._missing: list[int] = [len(b.members) for b in self.buckets]
        self._sent: list[bool] = [False] * len(self.buckets)
        self._spoiled = False
        self._seen: list[tuple[torch.Tensor, int] | None] = [None] * len(self._params)  # each grad sent, its version
        self._direct: dict[int, torch.Tensor | None] = {}  # the gradients sent in place (not copied), by parameter
        self._values_compared = False  # the values are compared at the first step that streams...
        self._compare_values = True  # ...and at every step once that found an edit the versions missed
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
            self._forget()

    def disarm(self) -> None:
        """No step in progress (the session closes, or pushes serially): cancel what is in flight."""
        with self._lock:
            if self._stream is not None:
                self._stream.cancel()
            self._open, self._stream = None, None
            self._forget()

    def _hook(self, index: int) -> Callable[[torch.Tensor], None]:
        def ready(param: torch.Tensor) -> None:
            self._ready(index, param)

        return ready

    def _ready(self, index: int, param: torch.Tensor) -> None:
        with PROBE.part("push_copy"), self._lock:
            if self._open is None or self._spoiled:
                return
            if index in self._counted:  # a second backward before step(): what went out is stale
                self._spoiled = True
                return
            self._counted.add(index)
            self._direct[index] = self._in_place(index)
            if self._direct[index] is None:
                self._copy(index)
            k = self._bucket_of[index]
            self._missing[k] -= 1
            if self._missing[k] == 0:
                self._send(k)

    def _in_place(self, index: int) -> torch.Tensor | None:
        """Parameter `index`'s gradient as the flat values its bucket sends, without a copy (the
        framing writes them into the messages), or None where it is copied into the flat buffer: a
        small one (its own message would cost more than the copy), one missing or not contiguous fp32
        on the CPU, or any on a step whose values are compared (the copy is what they are compared with)."""
        grad = self._params[index].grad
        if (self._compare_values or grad is None or grad.numel() < DIRECT_VALUES or grad.device.type != "cpu"
                or grad.dtype != torch.float32 or not grad.is_contiguous()):
            return None
        self._seen[index] = (grad, grad._version)
        self.sent_in_place += 1
        return grad.detach().view(-1)

    def _copy(self, index: int) -> None:
        p = self._params[index]
        start = self._offsets[index]
        out = self._grads[start : start + p.numel()]
        grad = p.grad
        if grad is None:
            out.zero_()
            self._seen[index] = None
        else:
            out.copy_(grad.detach().reshape(-1))
            self._seen[index] = (grad, grad._version)

    def _send(self, k: int) -> None:
        """Bucket `k` out: its gradients sent in place, and the runs of those copied as ranges of the flat buffer."""
        if self._stream is None:
            assert self._open is not None
            self._stream = self._open()
        run_start: int | None = None
        for i in self.buckets[k].members:
            direct = self._direct.get(i)
            if direct is None:
                run_start = self._offsets[i] if run_start is None else run_start
                continue
            if run_start is not None:
                self._stream.send(run_start, self._grads[run_start : self._offsets[i]])
                run_start = None
            self._stream.send(self._offsets[i], direct)
        if run_start is not None:
            self._stream.send(run_start, self._grads[run_start : self.buckets[k].stop])
        self._sent[k] = True

    def finish(self) -> Stream | None:
        """Backward is done: send the buckets still held (parameters without a gradient: zeros) and
        hand over the stream, every value sent once; None (and the stream cancelled) if a gradient
        changed after its bucket went out: the caller pushes the whole gradient instead."""
        with self._lock:
            if self._open is None:
                return None
            with PROBE.part("push_check"):
                stale = self._spoiled or self._stale()
            if stale:
                if self._stream is not None:
                    self._stream.cancel()
                self._open, self._stream = None, None
                self._forget()
                self.fallbacks += 1
                return None
            with PROBE.part("push_copy"):
                for k, bucket in enumerate(self.buckets):
                    if not self._sent[k]:
                        for i in bucket.members:
                            if i not in self._counted:
                                self._copy(i)
                        self._send(k)
            stream = self._stream
            self._open, self._stream = None, None
            self._forget()
            self.streamed += 1
            return stream

    def _forget(self) -> None:
        """Drop the references to the step's gradients (a loop that sets them to None frees them)."""
        self._seen = [None] * len(self._params)
        self._direct = {}

    def _stale(self) -> bool:
        """Whether a gradient changed after its bucket went out: by identity and version (an in-place
        edit), and on the first streamed step, or on every step once one edited unseen, by value."""
        sent = [i for k, bucket in enumerate(self.buckets) if self._sent[k] for i in bucket.members]
        if any(self._replaced(i) for i in sent):
            return True
        if not self._compare_values:
            return False
        edited = any(self._changed(i) for i in sent)
        if not self._values_compared:
            self._values_compared, self._compare_values = True, edited
        return edited

    def _replaced(self, index: int) -> bool:
        """Whether parameter `index`'s gradient is another tensor, or was written in place, since it was copied."""
        grad = self._params[index].grad
        seen = self._seen[index]
        if grad is None or seen is None:
            return (grad is None) != (seen is None)
        return grad is not seen[0] or grad._version != seen[1]

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

"""A push whose values are all ready (a step after backward, a report, a snapshot) as serialized chunks
in order, one server's part at a time: the header on the first chunk, then the end with the step's times."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import torch

from common.transport.chunk_frames import push_end_message, push_frame
from common.transport.messages import PushMeta, PushTimes
from common.transport.payload import frame_tensor
from worker.transport.bucket_stream import PushTiming


def ordered_push(meta: PushMeta, part: torch.Tensor, chunk_bytes: int, timing: PushTiming) -> Iterator[bytes]:
    """Serialized chunks of `part` (one server's values): each slice written once, straight into its
    message (bf16/fp16: converted on the way, common.transport.payload.frame_tensor), the header (its
    times 0) on the first; then the end, with `meta`'s times; `timing` told when the last is sent."""
    frame = push_frame(replace(meta, num_values=part.numel(), times=PushTimes()))
    sent = 0
    for message in frame_tensor(part, meta.wire_dtype, frame, chunk_bytes):
        sent += 1
        yield message
    yield push_end_message(sent, meta.times)
    timing.uploaded = time.perf_counter()

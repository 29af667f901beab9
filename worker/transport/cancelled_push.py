"""The whole push that follows a cancelled bucket stream (worker.paths.overlap's fallback, when a gradient
changed after its bucket went out). The server learns of the cancellation only when gRPC delivers it,
which under load can come after the whole push has arrived; until then it holds the cancelled stream
as the worker's push in flight and refuses the second (ps.rounds.inflight). That refusal is retried
here, so the step's gradient is not dropped for it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from common.errors import PUSH_IN_FLIGHT
from worker.transport.backoff import Backoff
from worker.transport.client import ServerError

T = TypeVar("T")

CANCELLED_STREAM_S = 10.0
"""How long the retries go on: the server drops a stream that stays silent for --push-idle (10 s by
default), a cancelled one at the latest then."""


def after_cancelled_stream(push: Callable[[], T], wait_s: float = CANCELLED_STREAM_S) -> T:
    """`push()`, retried with backoff for up to `wait_s` while the server refuses it because this
    worker's previous push is still in flight; any other error, or the same one after `wait_s`, is raised."""
    for delay in Backoff(initial=0.005, maximum=0.1, total=wait_s).delays():
        try:
            return push()
        except ServerError as exc:
            if exc.code != "FAILED_PRECONDITION" or PUSH_IN_FLIGHT not in exc.message:
                raise
        time.sleep(delay)
    return push()

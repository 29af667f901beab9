"""How far a streamed reply has come: per server range (a "lane": the coordinator's, and each shard's
with --shards) the prefix of its values already decoded into the flat parameters, or the error that
ended it. The client's receivers advance it; the forward's hooks (worker.paths.forward_order) and
the step wait on it."""

from __future__ import annotations

import threading
import time


class Arrivals:
    """How far the streamed reply of one step has come, per server range (a "lane")."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._lanes: list[list[int]] = []  # [start, stop, values in]
        self._open = 0  # lanes still receiving
        self._error: BaseException | None = None
        self.complete = True  # no reply streaming: every value is in (read without the lock: a hint)
        self.waited_s = 0.0  # time forwards waited for values since the last take_waited_ms

    def begin(self, ranges: list[tuple[int, int]]) -> list[int]:
        """A reply starts streaming values into these ranges of the flat vector; the lanes' numbers."""
        with self._cond:
            if self._open:
                raise RuntimeError("a reply is already streaming: wait_all() first")
            self._lanes = [[start, stop, 0] for start, stop in ranges]
            self._open, self._error = len(ranges), None
            self.complete = not ranges
            return list(range(len(ranges)))

    def advance(self, lane: int, filled: int) -> None:
        """Values [0, filled) of `lane`'s range are in."""
        with self._cond:
            self._lanes[lane][2] = filled
            self._cond.notify_all()

    def end(self, lane: int, error: BaseException | None = None) -> None:
        """`lane`'s reply is over: all its values are in, or `error` ended it (the first error is kept)."""
        with self._cond:
            if error is not None and self._error is None:
                self._error = error
            self._open -= 1
            if self._open == 0:
                self.complete = True
            self._cond.notify_all()

    def _has(self, start: int, stop: int) -> bool:
        for first, last, filled in self._lanes:
            lo, hi = max(start, first), min(stop, last)
            if lo < hi and first + filled < hi:
                return False
        return True

    def wait(self, start: int, stop: int) -> None:
        """Block until values [start, stop) are in, or the reply failed (the step then drops its
        gradient: `wait_all` raises). The time waited counts towards `waited_s`."""
        if self.complete:
            return
        with self._cond:
            if self._error is not None or self._has(start, stop):
                return
            began = time.perf_counter()
            self._cond.wait_for(lambda: self._error is not None or self._open == 0 or self._has(start, stop))
            self.waited_s += time.perf_counter() - began

    def wait_over(self) -> None:
        """Block until the reply is over (its error, if any, is kept for `wait_all`)."""
        with self._cond:
            if self._open:
                began = time.perf_counter()
                self._cond.wait_for(lambda: self._open == 0)
                self.waited_s += time.perf_counter() - began

    def wait_all(self) -> None:
        """Block until the reply is over; its error (a ServerError, or the decoder's) if it failed."""
        self.wait_over()
        with self._cond:
            error, self._error = self._error, None
            self._lanes = []
        if error is not None:
            raise error

    def take_waited_ms(self) -> float:
        """Milliseconds waited for values since the last call."""
        with self._cond:
            waited, self.waited_s = self.waited_s, 0.0
        return waited * 1000.0

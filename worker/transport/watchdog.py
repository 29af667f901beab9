"""Deadlines on a streaming call's messages: the wait for a reply's first chunk (its header) and the
pause between its chunks, each bounded (worker.transport.call_bounds), however long the whole reply.

gRPC's own deadline covers a call whole, which a long transfer or a BSP round legitimately outlasts;
so a reply is read through a `Watched` iterator, and one `Watchdog` thread per client cancels a call
whose reader has waited for its next message past the bound. Only the time a reader spends waiting in
`next()` counts: a push still being fed by backward, or a reply not read yet, is nobody's wait. The
reader then gets a ServerError (DEADLINE_EXCEEDED) that says what stalled and the flag that bounds it,
which the session recovers from as from a lost server (rejoin within --retry-for)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import grpc

from worker.transport.server_error import ServerError

T = TypeVar("T")


class Watchdog:
    """Cancels the calls whose reader waited past its deadline; one daemon thread, started at the first wait."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._cond = threading.Condition()
        self._waits: dict[Watched[Any], tuple[float, int]] = {}  # a reader waiting in next() -> (deadline, its turn)
        self._wake_at: float | None = None  # when the thread wakes next (None: when told)
        self._thread: threading.Thread | None = None
        self._closed = False

    def arm(self, watched: Watched[Any], seconds: float, turn: int) -> None:
        """`watched`'s reader waits from now for at most `seconds`, for its `turn`-th message."""
        deadline = self._clock() + seconds
        with self._cond:
            self._waits[watched] = (deadline, turn)
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="call-watchdog", daemon=True)
                self._thread.start()
            if self._wake_at is None or deadline < self._wake_at:
                self._cond.notify()

    def disarm(self, watched: Watched[Any]) -> None:
        with self._cond:
            self._waits.pop(watched, None)

    def close(self) -> None:
        """Stop the thread (the waits left are not cancelled)."""
        with self._cond:
            self._closed = True
            self._waits.clear()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                now = self._clock()
                late = [(w, turn) for w, (deadline, turn) in self._waits.items() if deadline <= now]
                for watched, _ in late:
                    del self._waits[watched]
                if not late:
                    self._wake_at = min((deadline for deadline, _ in self._waits.values()), default=None)
                    self._cond.wait(None if self._wake_at is None else self._wake_at - now)
                    self._wake_at = None
                    continue
            for watched, turn in late:  # outside the lock: a cancel runs gRPC's callbacks
                watched.expire(turn)


class Watched(Generic[T]):
    """A streaming call's replies, each waited for at most `first_s` (the first) or `idle_s` (the
    rest), as `watchdog` enforces; `what` names the call in the error (e.g. "the reply to a push"),
    `first_bound` and `idle_bound` say what sets each bound (e.g. "--timeout"). `on_first` hears
    when the first message arrived. Where `progress` says a later message brings nothing (a chunk
    without values), the wait for it counts on towards the next one's bound: progress is data, so a
    server cannot hold the reader for ever with empty chunks. `rest_s`, given the first message,
    bounds the reader's waits for all the others together (`rest_bound` says what sets it), so that
    neither can a trickle of values, each within the pause bound. Iterate it as the call; `cancel`
    cancels the call."""

    def __init__(self, call: Any, watchdog: Watchdog, *, what: str, first_s: float, idle_s: float,
                 first_bound: str = "--timeout", idle_bound: str = "--timeout",
                 on_first: Callable[[], None] | None = None, progress: Callable[[T], bool] | None = None,
                 rest_s: Callable[[T], float] | None = None, rest_bound: str = "") -> None:
        self.call = call
        self._watchdog = watchdog
        self.what = what
        self._bounds = ((first_s, first_bound), (idle_s, idle_bound))
        self._on_first = on_first
        self._progress = progress
        self._waited_s = 0.0  # the reader's waits since the last message that brought progress
        self._rest_s, self._rest_bound = rest_s, rest_bound
        self._rest_left = float("inf")  # of the rest's bound, what the reader's waits left
        self._by_rest = False  # the wait under way ends at the rest's bound, not the pause's
        self.received = 0
        self.expired: str | None = None  # why the watchdog cancelled the call
        self._turn = 0  # the reads begun
        self._waiting = False  # a read is under way

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        seconds, _ = self._bounds[self.received > 0]
        self._turn += 1
        self._waiting = True
        started = time.monotonic()
        pause_left = seconds - self._waited_s
        self._by_rest = self.received > 0 and self._rest_left < pause_left
        self._watchdog.arm(self, max(0.0, min(pause_left, self._rest_left)), self._turn)
        try:
            message: T = next(self.call)
        except grpc.RpcError:
            if self.expired is not None:
                raise ServerError("DEADLINE_EXCEEDED", self.expired) from None
            raise
        finally:
            self._waiting = False
            self._watchdog.disarm(self)
        if self.expired is not None:  # it came as the watchdog gave up: the call is cancelled all the same
            raise ServerError("DEADLINE_EXCEEDED", self.expired)
        self.received += 1
        waited = time.monotonic() - started
        if self.received > 1:
            self._rest_left -= waited
        elif self._rest_s is not None:
            self._rest_left = self._rest_s(message)
        if self.received > 1 and self._progress is not None and not self._progress(message):
            self._waited_s += waited
        else:
            self._waited_s = 0.0
        if self.received == 1 and self._on_first is not None:
            self._on_first()
        return message

    def expire(self, turn: int) -> None:
        """The watchdog's: the reader waited past its bound for its `turn`-th message; cancel the call,
        saying why (unless that read has ended meanwhile)."""
        if turn != self._turn or not self._waiting:
            return
        seconds, bound = self._bounds[self.received > 0]
        if self._by_rest and self._rest_s is not None:
            self.expired = f"{self.what} too slow: its values still incomplete after {self.received} chunk(s) ({self._rest_bound})"
        elif self.received:
            self.expired = f"{self.what} stalled: no data for {seconds:g} s after {self.received} chunk(s) ({bound})"
        else:
            self.expired = f"no answer to {self.what} within {seconds:g} s ({bound})"
        self.call.cancel()

    def cancel(self) -> bool:
        return bool(self.call.cancel())

"""A streaming reply read under deadlines (worker/transport/watchdog.py): the wait for its header and
each pause between its chunks are bounded, only while the reader waits, and the call is cancelled
with a line that says what stalled."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from worker.transport.server_error import ServerError
from worker.transport.watchdog import Watchdog, Watched

END = object()


class Cancelled(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.CANCELLED


class FakeCall:
    """A call whose messages the test hands over; cancel() ends the read in progress, as gRPC's does."""

    def __init__(self) -> None:
        self.messages: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.cancelled = threading.Event()

    def __next__(self) -> object:
        while not self.cancelled.is_set():
            try:
                message = self.messages.get(timeout=0.01)
            except queue.Empty:
                continue
            if message is END:
                raise StopIteration
            return message
        raise Cancelled()

    def cancel(self) -> bool:
        self.cancelled.set()
        return True


@pytest.fixture
def watchdog() -> Iterator[Watchdog]:
    dog = Watchdog()
    yield dog
    dog.close()


def watched(call: FakeCall, dog: Watchdog, **bounds: float) -> Watched[object]:
    return Watched(call, dog, what="the reply to a push", first_s=bounds.get("first_s", 0.3),
                   idle_s=bounds.get("idle_s", 0.3), first_bound="--timeout + the round")


def test_a_header_that_never_comes_ends_at_its_bound(watchdog: Watchdog) -> None:
    call = FakeCall()
    started = time.monotonic()
    with pytest.raises(ServerError) as info:
        next(watched(call, watchdog))
    assert 0.3 <= time.monotonic() - started < 2.0 and call.cancelled.is_set()
    assert info.value.code == "DEADLINE_EXCEEDED"
    assert info.value.message == "no answer to the reply to a push within 0.3 s (--timeout + the round)"


def test_values_that_stall_after_the_header_end_at_the_pause_bound(watchdog: Watchdog) -> None:
    call = FakeCall()
    reply = watched(call, watchdog, first_s=5.0)
    call.messages.put("header")
    call.messages.put("chunk 1")
    assert [next(reply), next(reply)] == ["header", "chunk 1"]
    with pytest.raises(ServerError, match=r"the reply to a push stalled: no data for 0.3 s after 2 chunk\(s\) \(--timeout\)"):
        next(reply)


def test_only_the_readers_wait_counts_and_a_reply_that_keeps_coming_is_read_whole(watchdog: Watchdog) -> None:
    call = FakeCall()
    firsts: list[int] = []
    reply = Watched(call, watchdog, what="a Pull", first_s=0.3, idle_s=0.3, on_first=lambda: firsts.append(1))
    call.messages.put("header")
    assert next(reply) == "header" and firsts == [1]
    time.sleep(0.6)  # the reader is busy elsewhere: nobody waits, nothing expires
    for i in range(10):  # each chunk well within the pause bound, the whole longer than it
        threading.Timer(0.1, call.messages.put, args=(i,)).start()
        assert next(reply) == i
    call.messages.put(END)
    assert list(reply) == [] and not call.cancelled.is_set() and reply.expired is None and firsts == [1]


def test_messages_without_progress_do_not_restart_the_pause_bound(watchdog: Watchdog) -> None:
    """A server that sends an empty chunk every 0.1 s, within a pause bound of 0.6 s: the waits add up
    to the bound from the last chunk with values, and the call ends there; a chunk with values
    restarts the bound."""
    call = FakeCall()
    reply = Watched(call, watchdog, what="a Pull", first_s=0.6, idle_s=0.6, progress=lambda m: m != "")
    call.messages.put("header")
    assert next(reply) == "header"
    for _ in range(2):
        threading.Timer(0.1, call.messages.put, args=("",)).start()
        assert next(reply) == ""
    threading.Timer(0.05, call.messages.put, args=("values",)).start()
    assert next(reply) == "values"  # 0.25 s waited for it: within the bound, which it restarts
    started = time.monotonic()
    with pytest.raises(ServerError, match=r"a Pull stalled: no data for 0.6 s after \d+ chunk\(s\)"):
        for _ in range(40):
            threading.Timer(0.1, call.messages.put, args=("",)).start()
            next(reply)
    assert 0.55 <= time.monotonic() - started < 3.0 and call.cancelled.is_set()


def test_a_trickle_of_messages_each_within_the_pause_bound_ends_at_the_bound_of_the_rest(watchdog: Watchdog) -> None:
    """The header says how long the rest may take, in the reader's waits: a message every 0.1 s,
    within a pause bound of 5 s, ends at the rest's 0.5 s; a reader busy elsewhere spends none of it."""
    call = FakeCall()
    reply = Watched(call, watchdog, what="a Pull", first_s=5.0, idle_s=5.0, rest_s=lambda header: 0.5,
                    rest_bound="--timeout + its size")
    call.messages.put("header")
    assert next(reply) == "header"
    time.sleep(0.6)  # busy elsewhere: not a wait
    started = time.monotonic()
    with pytest.raises(ServerError, match=r"a Pull too slow: its values still incomplete after \d+ chunk\(s\) "
                                          r"\(--timeout \+ its size\)"):
        for i in range(40):
            threading.Timer(0.1, call.messages.put, args=(i,)).start()
            next(reply)
    assert 0.45 <= time.monotonic() - started < 3.0 and call.cancelled.is_set()


def test_one_watchdog_serves_many_calls_each_at_its_own_bound(watchdog: Watchdog) -> None:
    slow, quick = FakeCall(), FakeCall()
    outcomes: dict[str, object] = {}

    def read(name: str, reply: Watched[object]) -> None:
        try:
            outcomes[name] = next(reply)
        except ServerError as exc:
            outcomes[name] = exc.code

    threads = [threading.Thread(target=read, args=("slow", watched(slow, watchdog, first_s=0.2))),
               threading.Thread(target=read, args=("quick", watched(quick, watchdog, first_s=5.0)))]
    for t in threads:
        t.start()
    threading.Timer(0.6, quick.messages.put, args=("header",)).start()
    for t in threads:
        t.join(5.0)
    assert outcomes == {"slow": "DEADLINE_EXCEEDED", "quick": "header"}

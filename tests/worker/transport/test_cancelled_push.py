"""The whole push after a cancelled bucket stream retries the server's in-flight refusal, and only that."""

from __future__ import annotations

import pytest

from common.errors import PUSH_IN_FLIGHT
from worker.transport.cancelled_push import after_cancelled_stream
from worker.transport.client import ServerError

IN_FLIGHT = ServerError("FAILED_PRECONDITION", f"worker 'w' {PUSH_IN_FLIGHT}; one at a time (this one is refused, the first goes on)")


def pushes(*outcomes: object):
    """A push that raises or returns each outcome in turn; its calls counted."""
    calls = []

    def push() -> object:
        outcome = outcomes[len(calls)]
        calls.append(outcome)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return push, calls


def test_the_in_flight_refusal_is_retried_until_the_push_goes_through() -> None:
    push, calls = pushes(IN_FLIGHT, IN_FLIGHT, "reply")
    assert after_cancelled_stream(push) == "reply" and len(calls) == 3


@pytest.mark.parametrize("error", [ServerError("FAILED_PRECONDITION", "round 3 is not open"),
                                   ServerError("UNAVAILABLE", f"{PUSH_IN_FLIGHT}?")])
def test_any_other_refusal_is_raised_at_once(error: ServerError) -> None:
    push, calls = pushes(error, "reply")
    with pytest.raises(ServerError) as info:
        after_cancelled_stream(push)
    assert info.value is error and len(calls) == 1


def test_the_retries_end_after_their_time() -> None:
    push, calls = pushes(*[IN_FLIGHT] * 100)
    with pytest.raises(ServerError) as info:
        after_cancelled_stream(push, wait_s=0.05)
    assert info.value is IN_FLIGHT and 2 <= len(calls) < 100

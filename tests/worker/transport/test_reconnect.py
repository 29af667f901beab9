"""A worker that lost its server or was turned away (worker/transport/reconnect.py): which codes are
transient and retried with backoff within --retry-for, and what it says of each."""

from __future__ import annotations

import pytest

from common.transport.messages import StepHeader
from worker.transport.client import ServerError
from worker.transport.reconnect import REJOIN_CODES, TRANSIENT_CODES, lost_because, rejoin_with_backoff

BUSY = ServerError("RESOURCE_EXHAUSTED", "80 control calls are held, the most this server holds; try again later")


class Reachable:
    """A client whose server always answers the connection."""

    target = "127.0.0.1:1"

    def wait_ready(self, timeout: float) -> None:
        return None


def plan(round: int = 0) -> StepHeader:
    return StepHeader(round=round, version=round, epoch=0, batch_size=8, done=False, lr=0.1, global_batch=16)


def test_a_server_out_of_reach_or_at_its_bound_of_calls_is_transient() -> None:
    assert {"UNAVAILABLE", "RESOURCE_EXHAUSTED"} <= set(TRANSIENT_CODES) <= set(REJOIN_CODES)
    assert lost_because(BUSY) == f"the server turned a call away for now ({BUSY.message})"


def test_a_rejoin_turned_away_is_tried_again_until_it_is_taken() -> None:
    answers: list[ServerError | None] = [BUSY, ServerError("UNAVAILABLE", "Socket closed"), BUSY, None]
    rejoined = plan(round=3)

    def rejoin(deadline: float) -> StepHeader:
        answer = answers.pop(0)
        if answer is not None:
            raise answer
        return rejoined

    assert rejoin_with_backoff("w", Reachable(), 30.0, BUSY, rejoin, lambda: "w-2", plan()) is rejoined  # type: ignore[arg-type]
    assert answers == []


def test_a_server_still_turning_calls_away_when_the_time_is_up_ends_the_worker_with_its_reason() -> None:
    def rejoin(deadline: float) -> StepHeader:
        raise BUSY

    with pytest.raises(ServerError, match="RESOURCE_EXHAUSTED: gave up after 0 s of retries") as info:
        rejoin_with_backoff("w", Reachable(), 0.3, BUSY, rejoin, lambda: "w", plan())  # type: ignore[arg-type]
    assert info.value.code == "RESOURCE_EXHAUSTED"


def test_a_reply_past_its_deadline_is_said_and_without_retries_ends_the_worker_with_its_reason() -> None:
    stalled = ServerError("DEADLINE_EXCEEDED", "a Pull from 127.0.0.1:1 stalled: no data for 5 s after 1 chunk(s) (--timeout)")
    assert lost_because(stalled) == f"the server did not answer in time ({stalled.message})"

    def rejoin(deadline: float) -> StepHeader:
        raise AssertionError("--retry-for 0: no rejoin")

    with pytest.raises(ServerError) as info:
        rejoin_with_backoff("w", Reachable(), 0.0, stalled, rejoin, lambda: "w", plan())  # type: ignore[arg-type]
    assert info.value.code == "DEADLINE_EXCEEDED" and info.value.message.endswith(stalled.message)


def test_a_rejoin_refused_because_the_job_ended_keeps_the_servers_reason() -> None:
    """A worker lost while the job ended (evicted, its connection dropped) hears of the end from its
    rejoin's refusal: the reason in it (ps/rounds/admission.py's words) decides its last line and exit
    status, an early end's included; a refusal that names none reads as a finished job."""
    early = "the workers left cannot split --global-batch (the workers' max_batch sum to 64 < global_batch 128)"
    for message, reason in ((f"the job has ended ({early})", early), ("the job has ended (stopping)", "stopping"),
                            ("the job at 127.0.0.1:1 has ended before it admitted this worker", "finished")):
        def rejoin(deadline: float, message: str = message) -> StepHeader:
            raise ServerError("FAILED_PRECONDITION", message)

        ended = rejoin_with_backoff("w", Reachable(), 30.0, BUSY, rejoin, lambda: "w", plan())  # type: ignore[arg-type]
        assert ended.done and ended.reason == reason, message

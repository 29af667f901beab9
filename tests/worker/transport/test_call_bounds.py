"""What --timeout bounds (worker/transport/call_bounds.py): a call answered at once, a push's reply that
waits for its round, and a Join, judged by what the server's Status says it waits for."""

from __future__ import annotations

import pytest

from common.transport.messages import JobStatus, WorkerStatus
from worker.transport.call_bounds import LONG_POLL_S, MIN_VALUES_RATE, ROUND_FACTOR, ROUND_MARGIN_S, CallBounds
from worker.transport.server_error import ServerError

TARGET = "10.0.0.7:50051"


def status(*, workers: int = 0, expected: int = 2, round: int = 0, mode: str = "bsp", done: bool = False) -> JobStatus:
    members = tuple(WorkerStatus(f"w{i}", f"w{i}", 1.0, 8, 0.0, 0, 0.0, False) for i in range(workers))
    return JobStatus(mode=mode, controller="dynamic", round=round, version=round, epoch=0, epochs=1, done=done,
                     global_batch=16, adjustments=0, last_accuracy=None, expected_workers=expected, path="ps",
                     path_why="", adaptive_batch="off", noise_scale=None, efficiency=None, lr=0.1, workers=members,
                     job_json="{}")


def test_a_call_answered_at_once_has_the_timeout_and_a_long_poll_its_few_seconds_more() -> None:
    bounds = CallBounds(5.0)
    assert bounds.call_s == 5.0 and bounds.long_poll_s == 5.0 + LONG_POLL_S
    with pytest.raises(ValueError):
        CallBounds(0.0)


def test_a_replys_values_may_take_the_timeout_and_a_second_per_min_rate_in_all() -> None:
    """A model of 100 million fp32 values (400 MB) may come at MIN_VALUES_RATE; no size is negative."""
    bounds = CallBounds(5.0)
    assert bounds.values_s(100_000_000) == pytest.approx(5.0 + 400_000_000 / MIN_VALUES_RATE)
    assert bounds.values_s(0) == bounds.values_s(-7) == 5.0


def test_a_push_reply_waits_for_a_warm_up_round_at_least_and_for_four_slow_rounds() -> None:
    bounds = CallBounds(5.0)
    assert bounds.reply_s() == 5.0 + ROUND_MARGIN_S  # no round timed: a newcomer's warm-up
    for t in range(4):  # replies 30 s apart: a slow job's rounds
        bounds.replied(100.0 + 30.0 * t)
    assert bounds.round_s() == ROUND_FACTOR * 30.0 and bounds.reply_s() == 5.0 + 120.0
    bounds.rejoined()  # the time away is no round
    bounds.replied(10_000.0)
    assert bounds.round_s() == ROUND_FACTOR * 30.0
    fast = CallBounds(5.0)
    for t in range(10):
        fast.replied(0.01 * t)
    assert fast.reply_s() == 5.0 + ROUND_MARGIN_S  # fast rounds: the warm-up bound still holds


def test_a_join_before_the_start_waits_while_the_server_expects_others() -> None:
    bounds = CallBounds(5.0)
    said = bounds.join_wait(TARGET, status(expected=4), waited_s=600.0)
    assert said == "the job to start (the server expects 4 workers)"


@pytest.mark.parametrize(
    ("answer", "needle"),
    [
        (status(expected=1), "though its job waits for no other worker"),
        (status(workers=2, mode="asp", round=3), "though its job admits a worker at once now"),
        (status(workers=0, round=7), "though its job admits a worker at once now"),
    ],
    ids=["alone-expected", "asp-running", "nobody-training"],
)
def test_a_join_the_servers_own_status_says_it_would_have_answered_ends(answer: JobStatus, needle: str) -> None:
    with pytest.raises(ServerError) as info:
        CallBounds(5.0).join_wait(TARGET, answer, waited_s=5.0)
    assert info.value.code == "DEADLINE_EXCEEDED" and needle in info.value.message
    assert f"the server at {TARGET} did not answer this worker's Join within 5 s (--timeout)" in info.value.message


def test_a_join_into_a_running_bsp_job_waits_for_the_open_round_within_its_bound() -> None:
    bounds = CallBounds(5.0)
    running = status(workers=2, round=9)
    assert "the open round to close" in bounds.join_wait(TARGET, running, waited_s=60.0)
    with pytest.raises(ServerError, match=r"did not admit this worker within 65 s \(--timeout 5 s \+ 60 s"):
        bounds.join_wait(TARGET, running, waited_s=66.0)


def test_a_join_to_a_job_that_ended_says_so() -> None:
    with pytest.raises(ServerError, match="has ended before it admitted this worker") as info:
        CallBounds(5.0).join_wait(TARGET, status(done=True, workers=1, round=4), waited_s=5.0)
    assert info.value.code == "FAILED_PRECONDITION"

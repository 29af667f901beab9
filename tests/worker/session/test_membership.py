"""A worker's recovery from a failed call (worker/session/membership.py): a server out of reach, at
its bound of calls held at once, or past a call's deadline is transient, retried with backoff
(rejoin_with_backoff) within --retry-for; a code that says the request itself is wrong ends the worker."""

from __future__ import annotations

from typing import Any

import pytest

import worker.session.membership
from common.transport.messages import StepHeader
from worker.session.membership import Membership
from worker.transport.client import ServerError

PLAN = StepHeader(round=3, version=3, epoch=0, batch_size=8, done=False, lr=0.1, global_batch=16)


def recovering(monkeypatch: pytest.MonkeyPatch) -> tuple[Membership, list[str]]:
    """A Membership with only what recover reads, whose retries are recorded instead of run."""
    retried: list[str] = []

    def retry(who: str, client: Any, retry_for: float, error: ServerError, *rest: Any) -> StepHeader:
        retried.append(error.code)
        return PLAN

    monkeypatch.setattr(worker.session.membership, "rejoin_with_backoff", retry)
    membership = Membership.__new__(Membership)
    membership.name, membership.client, membership.retry_for, membership.worker_id = "w", None, 30.0, "w-1"
    return membership, retried


def no_resync() -> StepHeader:
    raise AssertionError("no resync expected")


def no_rejoin(deadline: float) -> StepHeader:
    raise AssertionError("rejoin_with_backoff runs it")


@pytest.mark.parametrize("code", ["UNAVAILABLE", "RESOURCE_EXHAUSTED", "NOT_FOUND", "DEADLINE_EXCEEDED"])
def test_a_transient_refusal_is_retried_with_backoff(monkeypatch: pytest.MonkeyPatch, code: str) -> None:
    membership, retried = recovering(monkeypatch)
    assert membership.recover(ServerError(code, "try again later"), PLAN, no_resync, no_rejoin) is PLAN
    assert retried == [code]


@pytest.mark.parametrize("code", ["INVALID_ARGUMENT", "PERMISSION_DENIED", "UNAUTHENTICATED"])
def test_a_request_the_server_finds_wrong_ends_the_worker(monkeypatch: pytest.MonkeyPatch, code: str) -> None:
    membership, retried = recovering(monkeypatch)
    with pytest.raises(ServerError):
        membership.recover(ServerError(code, "no"), PLAN, no_resync, no_rejoin)
    assert retried == []


class RefusingClient:
    """A client whose first `refusals` Joins are refused with `code`, naming a wait of `told` s."""

    def __init__(self, refusals: int, code: str, told: float) -> None:
        self.refusals, self.code, self.told, self.joins = refusals, code, told, 0

    def join(self, *args: Any, **kwargs: Any) -> str:
        self.joins += 1
        if self.joins <= self.refusals:
            raise ServerError(self.code, f"worker name 'w' left without a push: join again in {self.told:.1f} s")
        return "joined"


def first_join(client: RefusingClient, retry_for: float, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[float]]:
    slept: list[float] = []
    monkeypatch.setattr(worker.session.membership.time, "sleep", slept.append)
    membership = Membership.__new__(Membership)
    membership.client, membership.name, membership.cores, membership.max_batch = client, "w", 1.0, 8  # type: ignore[assignment]
    membership.retry_for, membership._cuda_device = retry_for, None
    return membership._first_join(), slept


def test_a_first_join_refused_for_now_is_retried_after_the_wait_the_server_names(monkeypatch: pytest.MonkeyPatch) -> None:
    client = RefusingClient(2, "RESOURCE_EXHAUSTED", told=2.5)
    joined, slept = first_join(client, 60.0, monkeypatch)
    assert joined == "joined" and client.joins == 3
    assert len(slept) == 2 and all(wait >= 2.5 for wait in slept)


def test_a_first_join_refused_otherwise_or_without_retries_ends_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ServerError, match="join again"):
        first_join(RefusingClient(1, "INVALID_ARGUMENT", told=1.0), 60.0, monkeypatch)
    with pytest.raises(ServerError, match="join again"):
        first_join(RefusingClient(1, "RESOURCE_EXHAUSTED", told=1.0), 0.0, monkeypatch)


def test_a_told_wait_is_read_from_the_refusal_and_bounded() -> None:
    from worker.transport.reconnect import MAX_TOLD_WAIT_S, told_wait

    assert told_wait("join again in 4.0 s (the wait doubles)") == 4.0
    assert told_wait("no wait named") == 0.0
    assert told_wait("join again in 99999 s") == MAX_TOLD_WAIT_S

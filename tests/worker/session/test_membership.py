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

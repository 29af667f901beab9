"""A server that contradicts itself about the job, over the wire: the worker's own code in this process
against a server written from protos/ alone (tests/hostile_server.py). The spec of its Status (whose
model the worker measures its memory on before it joins), of the Join reply and of every later Join
(a rejoin) must be one job: they may differ only where a resume may change it
(common.job.spec.RESUMABLE_FIELDS). Any other difference ends the worker with one line naming the
fields and both values; it leaves and pushes nothing."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.hostile_server import GOOD_SPEC, Scenario, serving
from worker.connection import connect
from worker.transport.client import PSClient
from worker.transport.server_checks import UntrustedReply


def spec_json(**changes: Any) -> str:
    return json.dumps({**GOOD_SPEC, **changes})


@pytest.mark.parametrize(("changes", "said"), [
    ({"mode": "asp"}, "mode 'bsp' -> 'asp'"),
    ({"lr": 0.5}, "lr 0.1 -> 0.5"),
    ({"global_batch": 32, "epochs": 3}, "global_batch 16 -> 32)"),
    ({"model_options": {"hidden": 16, "layers": 1, "dropout": 0.5}}, "model_options {'hidden': 16, 'layers': 1} -> "),
], ids=["mode", "lr", "global-batch", "model"])
def test_a_join_reply_of_another_job_than_its_status_is_refused_naming_both(changes: dict[str, Any], said: str) -> None:
    """No --max-batch: the worker builds the Status's job and measures its memory on it, then joins.
    Before, it trained the Join reply's job, whatever the Status had said."""
    with serving(Scenario(join={"job_json": spec_json(**changes)})) as (fake, target):
        with pytest.raises(UntrustedReply, match=re.escape(said)) as raised:
            connect(target, name="w", timeout=5.0, retry_for=0.0, threads=None).close()
    assert str(raised.value).startswith("the server's Join reply names another job than the one it gave this worker "
                                        "before ("), raised.value
    assert fake.calls[:2] == ["Status", "Join"] and "Leave" in fake.calls, fake.calls
    assert "Pull" not in fake.calls and "Push" not in fake.calls, fake.calls


def test_a_join_reply_that_differs_from_the_status_where_a_resume_may_is_taken() -> None:
    """A resume between the Status and the Join (--epochs, --balance) is the same job: the worker runs
    under the Join's settings."""
    with serving(Scenario(join={"job_json": spec_json(epochs=2, balance="busy")})) as (_, target):
        session = connect(target, name="w", timeout=5.0, retry_for=0.0, threads=None)
        try:
            assert (session.spec.epochs, session.spec.balance) == (2, "busy")
        finally:
            session.close()


def test_a_rejoin_into_another_job_is_refused_at_once() -> None:
    """A rejoin's reply is held to the job the worker is in (before: refused as FAILED_PRECONDITION,
    which the rejoin retried to the end of --retry-for, to end on the last retry's reason)."""
    with serving(Scenario()) as (fake, target):
        client = PSClient(target, timeout=5.0)
        try:
            client.join("w", 1.0, max_batch=16)
            fake.scenario.join = {"job_json": spec_json(seed=7, epochs=4)}
            with pytest.raises(UntrustedReply, match=re.escape("names another job than the one it gave this worker "
                                                               "before (seed 0 -> 7)")):
                client.join("w", 1.0, max_batch=16)
        finally:
            client.close()
    assert fake.calls.count("Join") == 2 and fake.calls.count("Leave") == 1, fake.calls

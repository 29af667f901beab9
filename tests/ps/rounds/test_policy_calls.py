"""A batch policy that raises on a push's time, a round's or a decision loses that one call: the push
is answered, the round closes and the job goes on at the plan in force, and the failure is in the
metrics log (its first call, then every power-of-two count)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.coordinator_rounds import close_round, joined_job

B = 24


def fail(*args: Any, **kwargs: Any) -> Any:
    raise ZeroDivisionError("float division by zero")


@pytest.mark.parametrize("call", ["observe", "observe_round", "decision_due", "adjust"])
def test_a_policy_that_raises_loses_the_call_and_the_rounds_go_on(call: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A decision every round: scheduled (`--adjust-every 1`), or asked of the policy where none is."""
    async def run() -> None:
        async with joined_job("--global-batch", str(B), "--controller", "auto",
                              *(("--adjust-every", "1") if call != "decision_due" else ()),
                              events=("policy_error", "adjust")) as job:
            c, records = job.c, job.records
            await close_round(c, job.joined)
            setattr(c.policy, call, fail)
            plan = dict(c.policy.plan())
            for _ in range(5):
                replies = await close_round(c, job.joined)
                assert len(replies) == 2 and all(r.header.round == c.round for r in replies)
            assert c.round == 6 and c.policy.plan() == plan
            assert c.policy_calls.failures == {call: 5 if call != "observe" else 10}
            errors = [r for r in records if r["event"] == "policy_error"]
            counts = [1, 2, 4] if call != "observe" else [1, 2, 4, 8]
            assert [r["count"] for r in errors] == counts
            assert {(r["call"], r["policy"], r["error"]) for r in errors} == {
                (call, "auto", "ZeroDivisionError: float division by zero")}
            if call == "adjust":
                assert not [r for r in records if r["event"] == "adjust" and r["step"] > 1]

    asyncio.run(run())
    err = capsys.readouterr().err
    assert err.count(f"the batch policy failed in {call}") == 1 and "ZeroDivisionError" in err

"""A joining worker's declared dataset (ps/rounds/sampling.py, Sampling.check_join) through the
coordinator's Join: a negative length or a fingerprint too long or not printable is refused
(INVALID_ARGUMENT, naming the field) before anything changes: nobody joins, no fingerprint is kept."""

from __future__ import annotations

import asyncio
import re

import pytest

from common.errors import FailedPrecondition, InvalidArgument
from common.transport.messages import MAX_FINGERPRINT, JoinAsk
from ps.server_job import build_job
from tests.conftest import job_args


@pytest.mark.parametrize(("length", "fingerprint", "fragment"), [
    (-1, "", "dataset_length must be >= 0 (0: not declared), got -1"),
    (0, "x" * (MAX_FINGERPRINT + 1), f"dataset_fingerprint must be at most {MAX_FINGERPRINT} printable characters"),
    (0, "v3\x1b[2J", "dataset_fingerprint must be at most"),
    (0, "v3\n", "got 'v3\\n'"),
])
def test_a_malformed_dataset_declaration_is_refused_and_changes_nothing(length: int, fingerprint: str,
                                                                        fragment: str) -> None:
    job = build_job(job_args("--workers", "1"))
    c = job.coordinator
    try:
        with pytest.raises(InvalidArgument, match=re.escape(fragment)):
            asyncio.run(c.join(JoinAsk("a", 1.0, dataset_length=length, dataset_fingerprint=fingerprint)))
        assert c.members == {} and c.membership.pending == {} and c.sampling.fingerprint is None
        # the same worker with a well-formed declaration joins, and its fingerprint is the job's
        joined = asyncio.run(c.join(JoinAsk("a", 1.0, dataset_fingerprint="v" * MAX_FINGERPRINT)))
        assert joined.worker_id in c.members and c.sampling.fingerprint == "v" * MAX_FINGERPRINT
    finally:
        job.evaluator.close()
        job.metrics.close()


def test_a_fingerprint_declared_by_a_join_that_never_ended_in_the_job_refuses_no_one() -> None:
    """The first worker declares the job's fingerprint; if its join is cancelled while it waits for
    the others (its process died, its deadline passed), the workers that then come with another
    fingerprint start the job. One that joined keeps it the job's."""
    job = build_job(job_args("--workers", "2", "--sampling", "exact"))
    c = job.coordinator

    async def scenario() -> None:
        typo = asyncio.ensure_future(c.join(JoinAsk("a", 1.0, dataset_fingerprint="v1-typo")))
        await asyncio.sleep(0.05)
        assert c.sampling.fingerprint == "v1-typo" and len(c.membership.pending) == 1
        typo.cancel()
        with pytest.raises(asyncio.CancelledError):
            await typo
        assert c.membership.pending == {} and c.sampling.fingerprint is None
        joined = await asyncio.gather(*(c.join(JoinAsk(n, 1.0, dataset_fingerprint="v1")) for n in ("b", "c")))
        assert {j.worker_id for j in joined} == set(c.members) and c.sampling.fingerprint == "v1"
        with pytest.raises(FailedPrecondition, match="differs from the job's 'v1'"):
            c.sampling.check_join(0, "v1-typo")

    try:
        asyncio.run(scenario())
    finally:
        job.evaluator.close()
        job.metrics.close()

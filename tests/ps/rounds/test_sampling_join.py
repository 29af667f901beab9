"""A joining worker's declared dataset (ps/rounds/sampling.py, Sampling.check_join) through the
coordinator's Join: a negative length or a fingerprint too long or not printable is refused
(INVALID_ARGUMENT, naming the field) before anything changes: nobody joins, no fingerprint is kept."""

from __future__ import annotations

import asyncio
import re

import pytest

from common.errors import InvalidArgument
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

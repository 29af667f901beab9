"""--allreduce reports carry the squared gradient norms the gradient noise scale is fitted on
(--adaptive-batch gns): a norm that is negative or not finite is refused (INVALID_ARGUMENT) and changes
nothing, so the round still closes on the workers' own reports and its estimate stands."""

from __future__ import annotations

import pytest

from protos import ps_pb2
from tests.fast_path_jobs import TINY, Code, call, report
from tests.rpc_calls import TIMEOUT, expect_refused, header, join_all, push_chunks
import torch


@pytest.mark.parametrize("field", ["local_sq_norm", "global_sq_norm"])
def test_a_report_with_a_negative_or_non_finite_norm_is_refused(ps_server, threads, field: str) -> None:
    server = ps_server(*TINY, "--adaptive-batch", "gns")
    joins = join_all(server, threads, {"a": 1.0, "b": 1.0})
    a, b = joins["a"].worker_id, joins["b"].worker_id
    generation = joins["a"].generation
    for bad in (-1.0, float("nan"), float("inf")):
        h = header(a, 0, round=0, batch_size=16, kind=ps_pb2.PUSH_REPORT, generation=generation, **{field: bad})
        expect_refused(server, lambda: call(server.stub(), push_chunks(h, torch.empty(0))), Code.INVALID_ARGUMENT,
                       f"a push's {field} must be finite and >= 0")
    # the round is still open for both: their own reports close it
    replies = [threads.submit(call, server.stub(), report(w, 0, generation=generation)) for w in (a, b)]
    assert all(f.result(TIMEOUT).round == 1 for f in replies)

"""Tests for worker.session.sub_batch: when a worker measures a sub-batch's gradient norm, and what its push carries."""

from __future__ import annotations

import math

import pytest

from common.job.spec import JobSpec
from common.transport.messages import StepHeader
from worker.session.sub_batch import SubBatch


def header(batch: int, global_batch: int) -> StepHeader:
    return StepHeader(round=3, version=3, epoch=0, batch_size=batch, done=False, lr=0.1, global_batch=global_batch)


@pytest.mark.parametrize(("norms", "batch", "global_batch", "drawn", "ps_path", "size"), [
    (True, 64, 64, 64, True, 32),  # alone in its round: the first half
    (True, 7, 7, 7, True, 3),
    (True, 32, 64, 32, True, 0),  # another worker trains too: the round has its pair
    (False, 64, 64, 64, True, 0),  # the job measures no gradient norms
    (True, 64, 64, 64, False, 0),  # the fast path's report, or a probe
    (True, 1, 1, 1, True, 0),  # one sample has no part
    (True, 64, 64, 48, True, 24),  # fewer drawn than planned (an epoch's last slice): half of those
])
def test_a_worker_measures_the_first_half_only_where_it_trains_alone(norms: bool, batch: int, global_batch: int,
                                                                     drawn: int, ps_path: bool, size: int) -> None:
    sub = SubBatch()
    sub.draw(JobSpec(gradient_norms=norms), header(batch, global_batch), drawn, ps_path)
    assert sub.size == size
    assert sub.measured == (0, 0.0)


def test_the_push_carries_what_was_measured_for_the_batch_drawn_and_nothing_after() -> None:
    sub = SubBatch()
    spec = JobSpec(gradient_norms=True)
    sub.draw(spec, header(64, 64), 64, True)
    for size, norm, needle in ((31, 1.0, "this step's sub-batch is 32 samples"), (32, -1.0, "finite and >= 0"),
                               (32, math.inf, "finite and >= 0")):
        with pytest.raises(ValueError, match=needle):
            sub.note(size, norm)
    assert sub.measured == (0, 0.0)
    sub.note(32, 2.5)
    assert sub.measured == (32, 2.5)
    sub.draw(spec, header(32, 64), 32, True)  # the next batch: a new plan, nothing measured
    assert sub.measured == (0, 0.0)
    with pytest.raises(ValueError, match="0: none asked for"):
        sub.note(16, 1.0)

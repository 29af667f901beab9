"""The messages' own rules (common/transport/messages.py): a push's times are each finite and in
bounds, its data wait no more than the compute it is part of, its own exposed part no more than the
exposed time it is part of; its squared norms finite and >= 0 whatever its kind; a worker's step
reports times that pass that check; a Pull asks for the header alone or the optimizer's state, not both."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from common.errors import InvalidArgument
from common.transport.messages import PullAsk, PushMeta, PushTimes


def test_a_data_wait_over_the_compute_it_is_part_of_is_refused() -> None:
    PushTimes(compute_ms=5.0, data_wait_ms=5.0).check()  # the whole step waited for its batch
    PushTimes(compute_ms=5.0, exposed_ms=9.5, own_exposed_ms=9.5).check()  # exposed time is not bounded by it
    with pytest.raises(InvalidArgument, match=r"data_wait_ms 5.000001 exceeds compute_ms 5.0: the wait for the batch "
                                              r"is part of the step's compute, so at most compute_ms"):
        PushTimes(compute_ms=5.0, data_wait_ms=5.000001).check()
    with pytest.raises(InvalidArgument, match="data_wait_ms 1.0 exceeds compute_ms 0.0"):
        PushTimes(data_wait_ms=1.0).check()


@pytest.mark.parametrize("balance", ["compute", "busy", "cycle"])
@pytest.mark.parametrize(("mode", "allreduce"), [("bsp", False), ("bsp", True), ("asp", False)])
def test_a_steps_data_wait_is_at_most_its_compute(balance: str, mode: str, allreduce: bool) -> None:
    """A data wait measured on its own clock a hair over the compute is reported as the compute; one
    within it as it is."""
    over = PushTimes.of_step(10.0, 3.0, 2.0, balance, mode, allreduce, data_wait_ms=10.0 + 1e-9)
    assert over.data_wait_ms == 10.0
    over.check()
    within = PushTimes.of_step(10.0, 3.0, 2.0, balance, mode, allreduce, data_wait_ms=4.0)
    assert within.data_wait_ms == 4.0
    within.check()


def test_an_own_exposed_part_over_the_exposed_time_it_is_part_of_is_refused() -> None:
    PushTimes(exposed_ms=9.0, own_exposed_ms=9.0).check()  # all of it the worker's own
    with pytest.raises(InvalidArgument, match=r"own_exposed_ms 9.5 exceeds exposed_ms 9.0: the worker's own part of "
                                              r"the exposed time is part of it, so at most exposed_ms"):
        PushTimes(compute_ms=5.0, exposed_ms=9.0, own_exposed_ms=9.5).check()
    with pytest.raises(InvalidArgument, match="own_exposed_ms 1.0 exceeds exposed_ms 0.0"):
        PushTimes(own_exposed_ms=1.0).check()  # no exposed time measured: no part of it either


@pytest.mark.parametrize("balance", ["compute", "busy", "cycle"])
def test_a_steps_own_exposed_part_is_at_most_its_exposed_time(balance: str) -> None:
    """An own part taken on its own clock over the exposed time (or the last push's, after a step that
    measured none) is reported as the exposed time; busy time still adds the whole own part."""
    over = PushTimes.of_step(10.0, 3.0, 4.0, balance, "bsp", False)
    assert (over.exposed_ms, over.own_exposed_ms) == (3.0, 3.0)
    assert over.compute_ms == (14.0 if balance == "busy" else 10.0)
    over.check()
    assert PushTimes.of_step(10.0, 3.0, 2.0, balance, "bsp", False).own_exposed_ms == 2.0


@pytest.mark.parametrize("kind", ["values", "report", "snapshot"])
def test_a_pushs_squared_norms_are_finite_and_not_negative_whatever_its_kind(kind: str) -> None:
    meta = PushMeta("w", 0, 0, 8, PushTimes(), "float32", kind=kind)
    replace(meta, local_sq_norm=2.5, global_sq_norm=0.0).check_norms()
    for bad, field, value in ((replace(meta, local_sq_norm=-1.0), "local_sq_norm", -1.0),
                              (replace(meta, global_sq_norm=math.inf), "global_sq_norm", math.inf),
                              (replace(meta, local_sq_norm=math.nan), "local_sq_norm", math.nan)):
        with pytest.raises(InvalidArgument, match=rf"a push's {field} must be finite and >= 0 \(0: not measured\), got {value}"):
            bad.check_norms()


def test_a_pushs_sub_batch_is_part_of_its_batch_and_its_norm_needs_one() -> None:
    meta = PushMeta("w", 0, 0, 8, PushTimes(), "float32")
    for fine in ((0, 0.0), (1, 0.0), (4, 2.5), (7, 1e-30)):
        replace(meta, sub_batch=fine[0], sub_sq_norm=fine[1]).check_norms()
    for sub, norm, needle in ((8, 1.0, "0 \\(not measured\\) or 1 to batch_size − 1 \\(7\\), got 8"),
                              (-1, 1.0, "got -1"), (0, 1.0, "needs the sub_batch it was measured on"),
                              (4, -1.0, "sub_sq_norm must be finite and >= 0"), (4, math.nan, "sub_sq_norm must be finite")):
        with pytest.raises(InvalidArgument, match=needle):
            replace(meta, sub_batch=sub, sub_sq_norm=norm).check_norms()


def test_a_pull_asks_for_the_header_alone_or_the_optimizer_state_not_both() -> None:
    for header_only, optimizer_state in ((False, False), (True, False), (False, True)):
        PullAsk("w", header_only=header_only, optimizer_state=optimizer_state, wait_for_batch=True).check()
    with pytest.raises(InvalidArgument, match="not both: a header alone carries no optimizer state"):
        PullAsk("w", header_only=True, optimizer_state=True).check()

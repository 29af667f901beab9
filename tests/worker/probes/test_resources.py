"""`--slowdown`: the extra sleep scales the compute the step did, not pauses around it."""

from __future__ import annotations

import pytest

from worker.probes.resources import slowdown_delay


def test_a_frozen_step_is_not_multiplied() -> None:
    # 5 s of wall time (SIGSTOP mid-step) but 10 ms of CPU: the sleep is 99 x 10 ms, not 99 x 5 s
    assert slowdown_delay(5.0, 0.010, 100.0) == pytest.approx(0.99)


def test_parallel_compute_is_capped_at_wall_time() -> None:
    # two torch threads use 2x the CPU time of the wall time: a 4x slower machine takes 4x the wall time
    assert slowdown_delay(0.010, 0.020, 4.0) == pytest.approx(0.030)


def test_no_slowdown_no_sleep() -> None:
    assert slowdown_delay(1.0, 1.0, 1.0) == 0.0

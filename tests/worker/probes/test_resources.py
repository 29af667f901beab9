"""`--slowdown`: the extra sleep scales the compute the step did, not pauses around it; the slower
machine is put around a step's compute's end once, and is that end itself when nothing is emulated."""

from __future__ import annotations

import time

import pytest

from worker.probes.resources import SlowerMachine, slowdown_delay


def test_a_frozen_step_is_not_multiplied() -> None:
    # 5 s of wall time (SIGSTOP mid-step) but 10 ms of CPU: the sleep is 99 x 10 ms, not 99 x 5 s
    assert slowdown_delay(5.0, 0.010, 100.0) == pytest.approx(0.99)


def test_parallel_compute_is_capped_at_wall_time() -> None:
    # two torch threads use 2x the CPU time of the wall time: a 4x slower machine takes 4x the wall time
    assert slowdown_delay(0.010, 0.020, 4.0) == pytest.approx(0.030)


def test_no_slowdown_no_sleep() -> None:
    assert slowdown_delay(1.0, 1.0, 1.0) == 0.0


def end(started_s: float, started_cpu_s: float) -> float:
    return 0.0


def test_the_machine_as_it_is_adds_nothing_around_the_compute() -> None:
    assert SlowerMachine().around(end) is end


def test_a_slower_machine_burns_its_overhead_and_stretches_the_compute() -> None:
    slower = SlowerMachine(slowdown=2.0, overhead_ms=20.0).around(end)
    started, started_cpu = time.perf_counter(), time.process_time()
    assert slower(started, started_cpu) == 0.0
    cpu_s, wall_s = time.process_time() - started_cpu, time.perf_counter() - started
    assert cpu_s >= 0.020 and wall_s >= 2 * 0.020  # the overhead's CPU, then as long again asleep


@pytest.mark.parametrize(("slowdown", "overhead_ms"), [(0.5, 0.0), (float("nan"), 0.0), (1.0, -1.0), (1.0, float("inf")), (1.0, 1e308)])
def test_a_machine_cannot_be_faster_or_take_a_negative_overhead(slowdown: float, overhead_ms: float) -> None:
    with pytest.raises(ValueError, match="slowdown|step_overhead_ms"):
        SlowerMachine(slowdown, overhead_ms)

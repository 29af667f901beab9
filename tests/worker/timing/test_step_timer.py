"""A step's clocks (worker/timing/step_timer.py): compute from fetch to step() less the forward's
wait, exposed time from a compute's end to the next fetch plus that wait, the own part of the last
push, and the probe told where the main thread's parts begin and end."""

from __future__ import annotations

import time

import pytest

from common.job.spec import JobSpec
from worker.probes.cpu_parts import Probe
from worker.timing.step_timer import StepTimer
from worker.transport.bucket_stream import PushTiming


class Heard(Probe):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def round_begins(self, steps_done: int) -> None:
        self.calls.append(f"round {steps_done}")

    def batch_drawn(self) -> None:
        self.calls.append("drawn")

    def compute_ends(self) -> None:
        self.calls.append("compute ends")


def test_compute_leaves_out_the_forwards_wait_which_counts_as_exposed() -> None:
    probe = Heard()
    timer = StepTimer(lambda started_s, started_cpu_s: 20.0, probe)  # the forward waited 20 ms for parameters
    assert not timer.computing
    timer.fetch_begins(0, own_from_cpu=False)
    timer.batch_drawn(1.5)
    time.sleep(0.05)
    timer.compute_ends()
    assert not timer.computing and probe.calls == ["round 0", "drawn", "compute ends"]
    assert 50.0 - 20.0 <= timer.compute_ms < 50.0 - 20.0 + 200.0
    assert timer.exposed_ms == 20.0 and timer.data_wait_ms == 1.5
    time.sleep(0.03)
    timer.fetch_begins(1, own_from_cpu=False)  # exposed: from the compute's end to this fetch
    assert 30.0 <= timer.exposed_ms < 30.0 + 200.0


def test_the_times_a_push_reports_follow_the_jobs_balance() -> None:
    timer = StepTimer(lambda started_s, started_cpu_s: 0.0)
    timer.compute_ms, timer.exposed_ms, timer.push_ms, timer.data_wait_ms = 40.0, 9.0, 4.0, 2.0
    busy = timer.times(JobSpec(mode="bsp", balance="busy"))
    assert (busy.compute_ms, busy.exposed_ms, busy.own_exposed_ms, busy.data_wait_ms) == (44.0, 9.0, 4.0, 2.0)
    assert timer.times(JobSpec(mode="bsp", balance="compute")).compute_ms == 40.0
    asp = timer.times(JobSpec(mode="asp", balance="busy"))
    assert (asp.compute_ms, asp.exposed_ms, asp.own_exposed_ms) == (44.0, 0.0, 0.0)


def test_a_step_whose_waits_leave_less_compute_than_its_data_wait_reports_a_push_the_server_takes() -> None:
    """The forward's wait (Arrivals' total since the last step) may exceed the window it is taken from:
    compute is clamped at 0, and the data wait, part of it, with it, so PushTimes.check passes."""
    timer = StepTimer(lambda started_s, started_cpu_s: 1e6)
    timer.fetch_begins(0, own_from_cpu=False)
    timer.batch_drawn(1.5)
    timer.compute_ends()
    assert timer.compute_ms == 0.0 and timer.data_wait_ms == 1.5
    for balance in ("compute", "busy"):
        times = timer.times(JobSpec(mode="bsp", balance=balance))
        assert times.data_wait_ms == 0.0
        times.check()


def test_the_own_part_of_a_push_and_a_parked_wait() -> None:
    timer = StepTimer(lambda started_s, started_cpu_s: 5.0)
    now = time.perf_counter()
    timer.push_ended(PushTiming(uploaded=now - 0.010, replied=now - 0.004), pushed=now - 0.012)
    assert timer.push_ms == pytest.approx(2.0 + 4.0, abs=2.0)
    timer.fetch_begins(0, own_from_cpu=False)
    timer.compute_ends()
    assert timer.exposed_ms == 5.0
    timer.parked()  # the wait while parked is not exposed communication
    timer.fetch_begins(1, own_from_cpu=False)
    timer.compute_ends()
    assert timer.exposed_ms == 5.0  # this step's forward wait alone, not added to the last step's
    timer.fetch_begins(2, own_from_cpu=False)
    timer.drop()
    assert not timer.computing

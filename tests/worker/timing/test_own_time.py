"""A worker's own part of its step's communication (worker/timing/own_time.py), on either path."""

from __future__ import annotations

import pytest

from worker.transport.bucket_stream import PushTiming
from worker.timing.own_time import MAX_WALL_PER_CPU, OwnTime, push_own_ms


def test_the_fast_paths_own_part_is_its_cpu_at_the_computes_speed() -> None:
    own = OwnTime()
    # a compute of 80 ms wall on 10 ms of CPU: a quota of 1/8 core; then 2 ms of CPU before the next fetch
    own.compute_ended(80.0, 0.010, cpu_now_s=5.000)
    assert own.own_ms(5.002) == pytest.approx(16.0)


def test_waiting_costs_no_cpu_and_is_not_own() -> None:
    own = OwnTime()
    own.compute_ended(20.0, 0.020, cpu_now_s=1.0)
    assert own.own_ms(1.0) == 0.0


def test_a_span_is_counted_once() -> None:
    own = OwnTime()
    assert own.own_ms(3.0) == 0.0  # no compute ended yet
    own.compute_ended(10.0, 0.010, cpu_now_s=1.0)
    assert own.own_ms(1.001) == pytest.approx(1.0)
    assert own.own_ms(2.0) == 0.0


def test_a_compute_on_no_cpu_keeps_the_last_speed_and_the_bound_holds() -> None:
    own = OwnTime()
    own.compute_ended(30.0, 0.010, cpu_now_s=0.0)
    own.compute_ended(30.0, 0.0, cpu_now_s=0.0)  # no CPU measured: the speed stays 3 wall ms per CPU ms
    assert own.wall_per_cpu == pytest.approx(3.0)
    own.compute_ended(1e6, 1e-6, cpu_now_s=0.0)
    assert own.wall_per_cpu == MAX_WALL_PER_CPU


def test_the_ps_paths_own_part_leaves_out_the_wait_for_the_round() -> None:
    # pushed at 10.0, last chunk sent at 10.004, reply's first chunk at 10.050, model loaded at 10.053
    timing = PushTiming(uploaded=10.004, replied=10.050)
    assert push_own_ms(timing, 10.0, 10.053) == pytest.approx(7.0)
    assert push_own_ms(PushTiming(), 10.0, 10.053) == 0.0  # not recorded (--shards)

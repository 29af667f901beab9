"""deploy/docker_schedule.py's apply: the waits between phases. Pure: a fake clock, sleep and docker."""

from __future__ import annotations

import io
import time

from deploy import docker_schedule
from deploy.profiles import load_schedule


def test_a_huge_every_seconds_waits_in_steps_time_sleep_accepts() -> None:
    """`ps-cluster docker-schedule --schedule swap --every-seconds 1e300` applied the first phase and then
    died in time.sleep(1e300) with an OverflowError traceback."""
    phases = docker_schedule.plan(load_schedule("swap"), "bsp", 1e300)
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        time.sleep(0.0 if seconds <= docker_schedule.MAX_SLEEP_S else seconds)  # raises as the real one would
        slept.append(seconds)
        now[0] = 1e300 if len(slept) == 3 else now[0] + seconds  # after a few steps, the next phase's start

    ran: list[list[str]] = []
    docker_schedule.apply(phases[:2], out=io.StringIO(), run=ran.append, sleep=sleep, clock=lambda: now[0])
    assert len(ran) == 8 and slept[:3] == [docker_schedule.MAX_SLEEP_S] * 3
    assert max(slept) <= docker_schedule.MAX_SLEEP_S

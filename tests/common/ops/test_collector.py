"""common.ops.collector: the thresholds ps-server and the simulator run with, and what is frozen. Each
case runs in a child process, so this one's collector keeps its defaults."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from common.ops import collector

CHILD = """
import gc, json, weakref
from common.ops.collector import tune_collector
class Node: pass
before = gc.get_threshold()
job = [[i] for i in range(1000)]  # what a job holds once built
cycle = Node(); cycle.me = cycle; alive = weakref.ref(cycle); del cycle  # garbage at the call
tune_collector()
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": gc.get_freeze_count(),
                  "cycle_alive": alive() is not None, "enabled": gc.isenabled()}))
"""


@pytest.fixture(scope="module")
def seen() -> dict[str, object]:
    """What the child saw, once for the module's tests."""
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, timeout=60)
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_the_collector_runs_young_collections_seventy_times_less_often_and_stays_on(seen: dict[str, object]) -> None:
    assert seen["before"] == [700, 10, 10]
    assert seen["after"] == [collector.YOUNG, collector.MIDDLE, collector.OLD]
    assert collector.YOUNG >= 70 * 700 and seen["enabled"] is True


def test_what_the_process_holds_when_tuned_is_frozen_and_its_garbage_collected_first(seen: dict[str, object]) -> None:
    frozen = seen["frozen"]
    assert isinstance(frozen, int) and frozen >= 1000  # the job's lists at least
    assert seen["cycle_alive"] is False  # collected, not frozen for good

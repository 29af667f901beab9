"""ps.control.dynamic, the proportional policy: convergence to a balanced plan on simulated workers,
with and without a fixed per-step cost, on the HL profiles and on random speeds."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.simulated_workers import HL_SPEEDS, balanced, make_policy, run_to_steady, speed_map

FAST = settings(max_examples=40, deadline=None)


@pytest.mark.parametrize("name", list(HL_SPEEDS))
@pytest.mark.parametrize("keep_global_sum", [True, False])
def test_converges_from_uniform_without_intercept(name: str, keep_global_sum: bool) -> None:
    speeds = speed_map(HL_SPEEDS[name])
    ctl = make_policy(4, deadband=0.1, keep_global_sum=keep_global_sum, max_batch=1024)
    ctl.replan()
    assert run_to_steady(ctl, speeds) <= 3
    assert balanced(ctl.plan(), speeds, 0.0, 0.1)
    if keep_global_sum:
        assert sum(ctl.plan().values()) == 128


@st.composite
def speed_sets(draw: st.DrawFn) -> tuple[list[float], int]:
    """2-8 workers with speeds 1-16x apart, and a global batch large enough that min_batch never binds."""
    speeds = draw(st.lists(st.floats(1.0, 16.0), min_size=2, max_size=8))
    need = math.ceil(2 * sum(speeds) / min(speeds))
    return speeds, draw(st.integers(max(32, need), max(1024, need)))


@FAST
@given(speed_sets(), st.sampled_from([0.05, 0.1, 0.2]))
def test_converges_for_random_speeds_without_intercept(problem: tuple[list[float], int], deadband: float) -> None:
    speed_list, global_batch = problem
    speeds = speed_map(speed_list)
    ctl = make_policy(len(speed_list), global_batch=global_batch, deadband=deadband)
    ctl.replan()
    assert run_to_steady(ctl, speeds) <= 3
    assert sum(ctl.plan().values()) == global_batch
    assert balanced(ctl.plan(), speeds, 0.0, deadband)


# With a fixed per-step cost c (t_k = b_k/s_k + c) proportional control under-corrects: it assumes
# t proportional to b, so each step removes only about the share of the imbalance that is due to the
# batch-dependent part. Measured (uniform start, B = 128, c = f * B / sum(s), i.e. f times the
# balanced batch-dependent time):
#   deadband 0.10: HL8 f=0.5 -> 2, f=1 -> 3, f=2 -> 4; HL4 f=1 -> 3; slowdowns 1,1,2,4 f=1 -> 2
#   deadband 0.05: HL8 f=1 -> 4, f=2 -> 6
# and over 60k random draws (2-8 workers, speeds 1-16, f <= 1): at most 6 (deadband 0.05),
# 5 (0.10), 3 (0.20). The bounds asserted below leave a margin of one to two adjustments.
INTERCEPT_CASES = [
    ("HL8", 0.5, 2),
    ("HL8", 1.0, 3),
    ("HL8", 2.0, 4),
    ("HL4", 1.0, 3),
    ("HL2", 1.0, 1),
    ("slowdowns-1-1-2-4", 1.0, 2),
]


@pytest.mark.parametrize(("name", "fixed_cost", "measured"), INTERCEPT_CASES)
def test_converges_with_fixed_cost(name: str, fixed_cost: float, measured: int) -> None:
    speeds = speed_map(HL_SPEEDS[name])
    intercept = fixed_cost * 128 / sum(speeds.values())
    ctl = make_policy(4, deadband=0.1)
    ctl.replan()
    assert run_to_steady(ctl, speeds, intercept) == measured
    assert sum(ctl.plan().values()) == 128
    assert balanced(ctl.plan(), speeds, intercept, 0.1)


@FAST
@given(speed_sets(), st.sampled_from([0.05, 0.1, 0.2]), st.floats(0.0, 1.0))
def test_converges_for_random_speeds_with_fixed_cost(
    problem: tuple[list[float], int], deadband: float, fixed_cost: float
) -> None:
    speed_list, global_batch = problem
    speeds = speed_map(speed_list)
    intercept = fixed_cost * global_batch / sum(speed_list)
    ctl = make_policy(len(speed_list), global_batch=global_batch, deadband=deadband)
    ctl.replan()
    assert run_to_steady(ctl, speeds, intercept) <= 8
    assert sum(ctl.plan().values()) == global_batch
    assert balanced(ctl.plan(), speeds, intercept, deadband)

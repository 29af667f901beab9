"""The hold rule (hold.py): when a decision keeps the plan in force, asks for a confirmation, or
steps by the measured times."""

from __future__ import annotations

import pytest

from ps.control.auto.hold import GAIN_SDS, Verdict, bar, verdict
from ps.control.auto.solve import MIN_GAIN


def _verdict(*, far: bool = False, **kw: bool) -> tuple[Verdict, int]:
    """The verdict, and how often the far-from-balance test was asked (it reads every worker's times)."""
    asked = []
    args = dict(balanced=False, resolve=True, gains=True, confirming=False, idle=False, parks=False, exact_sum=True)
    args.update(kw)
    said = verdict(**args, measured_far=lambda: asked.append(1) or far)
    return said, len(asked)


def test_a_plan_measured_balanced_is_held_without_asking_whether_it_is_far_out_of_balance() -> None:
    assert _verdict(balanced=True, far=True) == (Verdict(hold=True, confirm=False, far=False, measured_step=False), 0)


def test_a_resolve_that_gains_waits_for_a_second_decision_and_the_second_installs_it() -> None:
    first, _ = _verdict()
    assert first == Verdict(hold=True, confirm=True, far=False, measured_step=False)
    second, _ = _verdict(confirming=True)
    assert second == Verdict(hold=False, confirm=False, far=False, measured_step=False)


@pytest.mark.parametrize("kw", [{"resolve": False}, {"idle": True}, {"parks": True}])
def test_a_step_a_raise_of_idle_workers_or_a_parking_is_installed_at_once(kw: dict[str, bool]) -> None:
    said, asked = _verdict(**kw)
    assert said == Verdict(hold=False, confirm=False, far=False, measured_step=False)
    assert asked == 0


def test_times_far_out_of_balance_confirm_a_resolve_at_once() -> None:
    assert _verdict(far=True)[0] == Verdict(hold=False, confirm=False, far=True, measured_step=False)


def test_laws_without_a_gain_on_a_plan_far_out_of_balance_step_at_the_second_decision() -> None:
    first, _ = _verdict(gains=False, far=True)
    assert first == Verdict(hold=True, confirm=True, far=False, measured_step=False)
    second, _ = _verdict(gains=False, far=True, confirming=True)
    assert second == Verdict(hold=True, confirm=False, far=False, measured_step=True)


def test_no_gain_holds_and_asks_nothing_more_where_the_plan_is_not_far_out_of_balance() -> None:
    assert _verdict(gains=False)[0] == Verdict(hold=True, confirm=False, far=False, measured_step=False)
    assert _verdict(gains=False, far=True, exact_sum=False) == (
        Verdict(hold=True, confirm=False, far=False, measured_step=False), 0)


def test_the_bar_is_the_noise_for_a_step_and_the_laws_and_half_the_deadband_for_a_resolve() -> None:
    never = lambda at: pytest.fail("a step has no idle workers to raise")  # noqa: E731
    assert bar(time_error=0.001, laws_error=0.5, deadband=0.1, resolve=False, gain=0.2, idle=never) == (MIN_GAIN, False)
    assert bar(time_error=0.04, laws_error=0.0, deadband=0.1, resolve=False, gain=0.2, idle=never) == (
        pytest.approx(GAIN_SDS * 0.04), False)
    assert bar(time_error=0.001, laws_error=0.04, deadband=0.1, resolve=True, gain=0.2, idle=lambda at: True) == (0.05, False)
    assert bar(time_error=0.001, laws_error=0.07, deadband=0.1, resolve=True, gain=0.2, idle=lambda at: True) == (0.07, False)


def test_the_bar_falls_to_the_laws_error_where_workers_measured_idle_would_be_raised() -> None:
    asked: list[float] = []
    assert bar(time_error=0.001, laws_error=0.035, deadband=0.1, resolve=True, gain=0.04,
               idle=lambda at: asked.append(at) or True) == (0.035, True)
    assert asked == [0.035]
    assert bar(time_error=0.001, laws_error=0.035, deadband=0.1, resolve=True, gain=0.04, idle=lambda at: False) == (0.05, False)
    # a gain within the laws' error, or beyond half the deadband, does not ask
    assert bar(time_error=0.001, laws_error=0.035, deadband=0.1, resolve=True, gain=0.03,
               idle=lambda at: pytest.fail("asked")) == (0.05, False)

"""Whether a decision holds the plan in force (docs/policies.md, "Holding the plan"): while it is
measured balanced, or while the new split does not gain enough (`bar`); a re-solve of laws that held waits
for a second decision to confirm its gain, unless the times measure the plan in force far out of
balance (imbalance.py), which confirms it; and laws that see no gain in a plan measured far out of
balance at two decisions in a row do not hold there: the measured proportional step replaces it.
Pure."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from ps.control.auto.solve import MIN_GAIN

GAIN_SDS = 2.0
"""A new split replaces the plan in force only if its predicted round is shorter by MIN_GAIN (as
parking must) and by this many standard errors of the noisiest worker's mean time; a re-solve of laws
that held, by half the deadband too (a smaller gain is not worth a move) and by their error on the
plan in force."""


def bar(*, time_error: float, laws_error: float, deadband: float, resolve: bool, gain: float,
        idle: Callable[[float], bool]) -> tuple[float, bool]:
    """The gain a new split must beat (`time_error`: the noisiest worker's standard error of its mean
    time, relative; `laws_error`: the laws' error on the plan in force, for a `resolve` of laws that
    held), and whether the workers measured early are raised on a smaller one: half the deadband is no
    bar where the measurement and the laws agree that a worker idles by the deadband (`idle(bar)`:
    whether the split nearest the plan within that bar raises one by it)."""
    noise_bar = max(MIN_GAIN, GAIN_SDS * time_error)
    if not resolve:
        return noise_bar, False
    laws_bar = max(noise_bar, laws_error)
    min_gain = max(laws_bar, deadband / 2)
    raised = laws_bar < gain <= min_gain and idle(laws_bar)
    return (laws_bar if raised else min_gain), raised


class Verdict(NamedTuple):
    """What the rule says of a decision."""

    hold: bool
    """Keep the plan in force (unless `measured_step` replaces it by a step that moves a worker)."""
    confirm: bool
    """The next decision confirms (or not) this one's gain; the plan in force stays meanwhile."""
    far: bool
    """The times measure the plan far out of balance, and confirm the new split at once."""
    measured_step: bool
    """Take the measured proportional step where it moves a worker: the plan was measured far out of
    balance at the decision before too, and the laws see no gain in it."""


def verdict(*, balanced: bool, resolve: bool, gains: bool, confirming: bool, idle: bool, parks: bool,
            exact_sum: bool, measured_far: Callable[[], bool]) -> Verdict:
    """The rule for a decision whose plan in force is `balanced` as measured (its parking the solve's),
    a `resolve` of laws that held (no change, no step, no re-probe), whose new split `gains` beyond the
    bar, `confirming` the decision before's, raising workers measured `idle`, or that `parks` an active
    worker (the solve parks only one that surely slows the round: no confirmation). `exact_sum`: the
    plan makes up B exactly (BSP); `measured_far`: whether the times measure the plan in force far out
    of balance, asked only where the verdict turns on it."""
    confirm = resolve and gains and not balanced and not confirming and not idle and not parks
    measured = not balanced and exact_sum and (confirm or not gains) and measured_far()
    far = confirm and measured
    confirm = confirm and not measured
    hold = balanced or confirm or not gains
    if hold and measured and not confirming:
        confirm = True  # the next decision, measuring it far out of balance again, steps
    return Verdict(hold, confirm, far, hold and measured and confirming)

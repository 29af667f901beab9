"""ps.control.model.time_fit and observations: a worker's fit recovers its line, forgets an old speed,
drops outliers and knows its uncertainty, and is computed once until its observations change (pure)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ps.control.config import PolicyConfig
from ps.control.model import time_fit
from ps.control.model.observations import Observations
from ps.control.policy import build_policy


@pytest.fixture
def counted_groups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How often the fits group observations (each fit groups its times and its exposed times)."""
    calls = [0]
    groups = time_fit._groups

    def counting(by_batch):  # noqa: ANN001, ANN202
        calls[0] += 1
        return groups(by_batch)

    monkeypatch.setattr(time_fit, "_groups", counting)
    return calls


def observed(rnd: random.Random) -> Observations:
    obs = Observations()
    for b in (16, 16, 16, 16, 24, 24, 24, 24):
        obs.add(b, 0.5 * b + 10.0 + rnd.gauss(0.0, 0.3), None)
    return obs


def test_a_fit_is_computed_once_until_the_observations_change(counted_groups: list[int]) -> None:
    obs = observed(random.Random(0))
    first = obs.fit(3)
    assert obs.fit(3) is first and counted_groups[0] == 2
    obs.add(24, 30.0, None)
    assert obs.fit(3) == Observations(obs.items, obs.seq).fit(3) != first
    before = obs.fit(3)
    obs.rescale(2.0, keep=3)
    assert obs.fit(3) == Observations(obs.items, obs.seq).fit(3) != before
    assert obs.fit(3, exclude_last=2) == Observations(obs.items, obs.seq).fit(3, exclude_last=2)


def test_a_decision_at_many_workers_fits_each_worker_a_few_times(counted_groups: list[int]) -> None:
    """The model policy asks for every worker's fit many times a decision (whether it is identified,
    its finish time, the report): each of 300 workers was fitted up to seven times a decision."""
    rnd = random.Random(1)
    n = 300
    policy = build_policy(PolicyConfig(policy="model", global_batch=32 * n))
    speed = {f"w{i}": rnd.lognormvariate(0.0, 0.5) for i in range(n)}
    for k in speed:
        policy.add_worker(k)
    policy.replan()
    costs = []
    for round_index in range(40):
        for k, b in policy.plan().items():
            if b:
                policy.observe(k, b, (0.5 * b + 10.0) * speed[k] * rnd.lognormvariate(0.0, 0.03))
        if round_index:
            policy.observe_round(max((0.5 * b + 10.0) * speed[k] for k, b in policy.plan().items() if b) + 1.0)
        if round_index % 5 == 4 or policy.decision_due():
            counted_groups[0] = 0
            policy.adjust()
            costs.append(counted_groups[0])
    assert max(costs) <= 4 * n


def test_only_groups_that_no_longer_age_are_kept_and_kept_or_not_a_group_is_the_same() -> None:
    # batch size: (ages, times), oldest first: batch 16's times are all OLDEST_WEIGHT old, batch 24's new;
    # a fit keeps the first group for the next fit, not the second, new at every fit (its weights shift)
    ages = {16: [43 - i for i in range(4)], 24: [3 - i for i in range(4)]}
    times = {16: [20.0 + i for i in range(4)], 24: [28.0 + 0.1 * i for i in range(4)]}
    weights = {b: [max(time_fit.OLDEST_WEIGHT, time_fit.FORGET ** age) for age in ages[b]] for b in ages}
    time_fit._kept_group.cache_clear()
    grouped = time_fit._groups({b: (list(weights[b]), list(times[b])) for b in ages})
    assert [g.batch for g in grouped] == [16, 24]
    assert time_fit._kept_group.cache_info().currsize == 1
    assert time_fit._groups({b: (list(weights[b]), list(times[b])) for b in ages}) == grouped
    assert time_fit._kept_group.cache_info().hits == 1
    assert grouped[1] == time_fit._group(24, tuple(weights[24]), tuple(times[24]))


def test_a_slope_from_nearby_batches_within_its_noise_is_not_measured() -> None:
    # t = 5 b + 100 with 5% noise: from batches 51-59 some fits leave the slope within its noise (a line
    # tilted flat there has a break-even s/q of any size); from batches 20 and 60 every fit measures it
    rng = random.Random(3)

    def line(batches: list[int]) -> time_fit.Line:
        items = [(i, b, (5.0 * b + 100.0) * (1.0 + rng.gauss(0.0, 0.05)), None) for i, b in enumerate(batches)]
        fit = time_fit.fit_of(items, 3)
        assert fit is not None
        return fit.line

    nearby = [line([51, 55, 59] * 4) for _ in range(20)]
    apart = [line([20, 60] * 6) for _ in range(20)]
    assert not all(time_fit.slope_measured(x) for x in nearby)
    assert all(time_fit.slope_measured(x) for x in apart)
    assert not time_fit.slope_measured(time_fit.Line(1e-6, 40.0, var_q=0.2))
    assert time_fit.slope_measured(time_fit.Line(2.0, 0.0))  # an exact line


def test_the_newest_run_is_kept_as_the_items_hold_it() -> None:
    """`run` and `recent` read a run kept as times are added and pruned: it is always the newest
    observations in a row at one batch size among those kept, as the items say."""
    rnd = random.Random(3)
    obs = Observations()
    for _ in range(400):
        batch = rnd.choice([8, 8, 8, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80])
        obs.add(batch, rnd.uniform(1.0, 9.0), rnd.choice([None, 0.5]))
        newest = obs.items[-1][1]
        tail = []
        for _, b, ms, e in reversed(obs.items):
            if b != newest:
                break
            tail.append(ms + (e or 0.0))
        tail.reverse()
        assert obs.run(newest) == len(tail) and obs.run(newest + 1) == 0
        assert obs.recent(newest, len(tail)) == tail
        assert obs.recent(newest, len(tail) + 1) is None and obs.recent(newest + 1, 1) is None
    rebuilt = Observations(obs.items, obs.seq)
    assert rebuilt.run(obs.items[-1][1]) == obs.run(obs.items[-1][1])
    with pytest.raises(ValueError, match="at least one"):
        obs.recent(obs.items[-1][1], 0)


def _reference_without_outliers(weights: list[float], times: list[float]) -> tuple[list[float], list[float]]:
    """The outlier rule written plainly: every deviation against the limit from the deviations' median."""
    if len(times) < 4:
        return weights, times
    median = time_fit.sorted_median(sorted(times))
    deviations = [abs(t - median) for t in times]
    spread = max(1.4826 * time_fit.sorted_median(sorted(deviations)), time_fit.MIN_REL_NOISE * abs(median), 1e-9)
    inside = [i for i, d in enumerate(deviations) if d <= time_fit.OUTLIER_MADS * spread]
    return [weights[i] for i in inside], [times[i] for i in inside]


@pytest.mark.parametrize("seed", range(5))
def test_outliers_are_those_of_the_plain_rule_bit_for_bit(seed: int) -> None:
    """`_without_outliers` skips the deviations' median where no time can be beyond the limit: the
    same times are left out as by the plain rule, whatever the noise (none, the floor's, more, stalls)."""
    rnd = random.Random(seed)
    for _ in range(2000):
        n = rnd.randint(1, 17)
        noise = rnd.choice([0.0, 0.005, time_fit.MIN_REL_NOISE, 0.05, 0.3])
        times = [100.0 * (1.0 + rnd.gauss(0.0, noise)) * (2.0 if rnd.random() < 0.1 else 1.0) for _ in range(n)]
        if rnd.random() < 0.2:  # on the floor's limit exactly
            times[0] = 100.0 * (1.0 + time_fit.OUTLIER_MADS * time_fit.MIN_REL_NOISE)
            times[1:] = [100.0] * (n - 1)
        weights = [rnd.random() for _ in range(n)]
        got = time_fit._without_outliers(weights, times)
        assert (list(got[0]), list(got[1])) == _reference_without_outliers(weights, times)


@settings(max_examples=30, deadline=None)
@given(st.floats(0.05, 5.0), st.floats(0.0, 200.0), st.integers(0, 2**16))
def test_fit_recovers_q_and_s_from_noisy_times(q: float, s: float, seed: int) -> None:
    rnd = random.Random(seed)
    obs = Observations()
    for b in [16, 48] * 12:
        obs.add(b, (q * b + s) * (1.0 + rnd.gauss(0.0, 0.02)), None)
    fit = obs.fit(min_samples=3)
    assert fit is not None and fit.batches == 2
    for b in (16, 32, 48):  # the line within the noise where it was measured
        assert fit.line.at(b) == pytest.approx(q * b + s, rel=0.03)
    # the slope: two group means 32 samples apart, each within a few noise widths
    assert fit.line.q == pytest.approx(q, rel=0.1, abs=0.003 * (q * 48 + s))
    assert fit.line.s == pytest.approx(s, abs=0.1 * (q * 48 + s))


def test_fit_forgets_an_old_speed_and_drops_outliers() -> None:
    obs = Observations()
    for _ in range(10):
        obs.add(20, 2.0 * 20 + 10, None)
        obs.add(40, 2.0 * 40 + 10, None)
    for _ in range(10):  # twice as fast now; one stall among them
        obs.add(20, 1.0 * 20 + 5, None)
        obs.add(40, 1.0 * 40 + 5, None)
    obs.add(40, 500.0, None)
    fit = obs.fit(min_samples=3)
    assert fit is not None
    assert fit.line.at(40) == pytest.approx(45.0, rel=0.15)


def test_one_batch_size_gives_a_proportional_line() -> None:
    obs = Observations()
    for _ in range(5):
        obs.add(32, 64.0, None)
    fit = obs.fit(min_samples=3)
    assert fit is not None and fit.batches == 1 and (fit.line.q, fit.line.s) == (2.0, 0.0)


def test_the_fit_knows_its_uncertainty_and_caution_grows_away_from_the_data() -> None:
    obs = Observations()
    rnd = random.Random(1)
    for _ in range(12):
        for b in (40, 60):
            obs.add(b, (0.5 * b + 10.0) * (1 + rnd.gauss(0, 0.05)), None)
    fit = obs.fit(3)
    assert fit is not None
    line = fit.line
    assert 40 <= line.centre <= 60
    assert line.sd(50) < line.sd(120) < line.sd(240)
    assert fit.finish.cautious(50) > fit.finish.at(50)
    assert fit.finish.cautious(240) - fit.finish.at(240) > fit.finish.cautious(60) - fit.finish.at(60)
    values = [fit.finish.cautious(b) for b in range(0, 400)]
    assert values == sorted(values)  # nondecreasing, as the split needs

"""ps.control.model.time_fit: a worker's fit is computed once until its observations change (pure)."""

from __future__ import annotations

import random

import pytest

from ps.control.config import PolicyConfig
from ps.control.model import time_fit
from ps.control.model.time_fit import Observations
from ps.control.policy import build_policy


@pytest.fixture
def counted_groups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How often the fits group observations (each fit groups its times and its exposed times)."""
    calls = [0]
    groups = time_fit.groups

    def counting(items):  # noqa: ANN001, ANN202
        calls[0] += 1
        return groups(items)

    monkeypatch.setattr(time_fit, "groups", counting)
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

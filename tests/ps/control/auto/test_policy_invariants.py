"""ps.control.auto under random settings and histories (hypothesis): every plan sums exactly to B (ASP:
where the bounds allow), keeps each worker within its bounds (0 only for a parked worker, only where
parking is on), is whole micro-batches with --micro-batch, and the state survives a checkpoint and a
resume under other settings; bad input changes nothing."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ps.control.config import PolicyConfig
from ps.control.policy import build_policy, policy_from_state, reconfigured

FAST = settings(max_examples=20, deadline=None)


@st.composite
def policies(draw: st.DrawFn) -> tuple[Any, dict[str, tuple[float, float]]]:
    """A planned auto policy with random settings and bounds (always feasible), and each worker's
    simulated cost (q, s)."""
    bsp = draw(st.booleans())
    n = draw(st.integers(1, 5))
    micro = draw(st.sampled_from([1, 1, 2, 4])) if bsp else 1
    global_batch = micro * draw(st.integers(4 * n, 256 // micro))
    config = PolicyConfig(policy="auto", global_batch=global_batch, keep_global_sum=bsp, micro_batch=micro,
                          min_batch=draw(st.integers(1, 3)), park=draw(st.booleans()),
                          deadband=draw(st.sampled_from([0.0, 0.05, 0.1, 0.3])),
                          min_samples=draw(st.sampled_from([1, 2, 3])))
    ctl = build_policy(config)
    costs = {}
    for i in range(n):
        hi = draw(st.none() | st.integers(global_batch // n + micro, 2 * global_batch))
        ctl.add_worker(f"w{i}", max_batch=hi)
        costs[f"w{i}"] = (draw(st.floats(0.01, 5.0)), draw(st.floats(0.0, 200.0)))
    ctl.replan()
    return ctl, costs


def check(ctl: Any, exact_sum: bool = True) -> None:
    """The plan's sum, bounds, micro-batches and parking rules."""
    config, plan = ctl.config, ctl.plan()
    bounds = {k: (lo, hi) for k, _, lo, hi in ctl.worker_bounds()}
    for k, b in plan.items():
        lo, hi = bounds.get(k, (None, None))
        if b == 0:
            assert config.park and config.keep_global_sum, plan
            continue
        assert b >= (lo or config.min_batch) and b <= (hi or config.default_max_batch), (k, b, bounds)
        assert b % config.micro_batch == 0, plan
    if exact_sum and config.keep_global_sum and plan:
        assert sum(plan.values()) == config.global_batch, plan
    if plan and config.keep_global_sum:
        assert any(b > 0 for b in plan.values())


@FAST
@given(policies(), st.data())
def test_every_plan_sums_to_b_within_the_bounds_in_whole_micro_batches(
        problem: tuple[Any, dict[str, tuple[float, float]]], data: st.DataObject) -> None:
    ctl, costs = problem
    rnd = random.Random(data.draw(st.integers(0, 2**16)))
    noise = data.draw(st.sampled_from([0.0, 0.05, 0.2]))
    check(ctl)
    next_id = 0
    for step in range(data.draw(st.integers(10, 40))):
        if step == 15:  # a change of speed: every worker's costs scaled by its own factor
            costs = {k: (q * f, s * f) for (k, (q, s)), f in zip(costs.items(), (rnd.choice([0.25, 1.0, 4.0])
                                                                                   for _ in costs))}
        plan = ctl.plan()
        finishes = []
        for k, b in plan.items():
            if b > 0:
                q, s = costs[k]
                t = max(0.0, (q * b + s) * (1 + rnd.gauss(0, noise)))
                finishes.append(t)
                ctl.observe(k, b, t)
        if finishes:
            ctl.observe_round(max(finishes) + 1.0)
        op = data.draw(st.sampled_from(["round"] * 4 + ["adjust", "adjust", "leave", "join"]))
        if op == "adjust" or ctl.decision_due():
            ctl.adjust()
            check(ctl)
        elif op == "leave" and len(plan) > 1:
            gone = data.draw(st.sampled_from(sorted(plan)))
            ceiling = sum(int(hi or ctl.config.default_max_batch) for k, _, _, hi in ctl.worker_bounds() if k != gone)
            if ctl.config.keep_global_sum and ceiling < ctl.config.global_batch:
                continue  # the others' max batches cannot make up B: the server keeps such a worker
            ctl.remove_worker(gone)
            ctl.replan()
            costs.pop(gone)
            check(ctl)
        elif op == "join" and ctl.can_add():
            name = f"n{next_id}"
            next_id += 1
            ctl.add_worker(name)
            costs[name] = (rnd.uniform(0.01, 5.0), rnd.uniform(0.0, 200.0))
            ctl.replan()
            check(ctl)
    state = json.loads(json.dumps(ctl.state_dict()))
    again = policy_from_state(state)
    assert again.state_dict() == state
    assert again.plan() == ctl.plan()
    check(again)
    resumed = reconfigured(ctl, replace(ctl.config, park=not ctl.config.park, deadband=0.2))
    check(resumed)
    assert sorted(resumed.workers()) == sorted(ctl.workers())


@FAST
@given(policies(), st.data())
def test_rejected_input_changes_nothing(problem: tuple[Any, dict[str, tuple[float, float]]],
                                        data: st.DataObject) -> None:
    ctl, _ = problem
    k = data.draw(st.sampled_from(ctl.workers()))
    b = ctl.plan()[k] or ctl.config.micro_batch
    ctl.observe(k, b, 3.0)
    before = json.dumps(ctl.state_dict(), sort_keys=True)
    bad: list[Callable[[], object]] = [
        lambda: ctl.observe("ghost", b, 1.0),
        lambda: ctl.observe(k, data.draw(st.integers(-5, 0)), 1.0),
        lambda: ctl.observe(k, b, data.draw(st.sampled_from([math.nan, math.inf, -1e-9]))),
        lambda: ctl.observe(k, b, 1.0, exposed_ms=-1.0),
        lambda: ctl.observe_round(-1.0),
        lambda: ctl.add_worker(k),
        lambda: ctl.remove_worker("ghost"),
    ]
    with pytest.raises(ValueError):
        data.draw(st.sampled_from(bad))()
    assert json.dumps(ctl.state_dict(), sort_keys=True) == before

"""The auto policy at hundreds of workers (benchmarks/simulation's BSP workers of lognormal speeds with
a fixed cost, 5% noise on every step): its plan settles in a few decisions, and a law whose time per
sample its times do not measure is not cut as far as its flat line asks. Pure."""

from __future__ import annotations

import math
import statistics

import pytest

from benchmarks.simulation import metrics
from benchmarks.simulation.engine import Event, Scenario, simulate
from ps.control.auto.policy import AutoPolicy
from ps.control.config import PolicyConfig
from ps.control.model.time_fit import SLOPE_SDS, slope_measured
from ps.control.policy import build_policy


def test_hundreds_of_workers_settle_in_a_few_decisions() -> None:
    """256 workers, B = 64 a worker, a decision every 5 rounds. Seeds 0-5 settled in 6, 12, 7, 9, 10 and
    5 decisions (median 8) when a re-solve that found some laws still lines through the origin moved
    every worker as far as the solve asked, and asked for a decision after it (3, 5, 17, 3, 13 and 3
    without). The final plan stays within 6% of the optimal round's compute."""
    steady, compute = [], []
    for seed in range(6):
        trace = simulate(Scenario(policy="auto", workers=256, global_batch=64 * 256, rounds=100, seed=seed))
        judged = metrics.phase(trace, 0, 100)
        steady.append(judged["decisions_to_steady"] if judged["decisions_to_steady"] is not None else math.inf)
        compute.append(judged["compute_over_optimum"])
    assert statistics.median(steady) <= 5, steady
    assert max(compute) <= 1.06, compute


def test_a_law_whose_slope_is_not_measured_is_priced_below_its_batch_no_flatter_than_its_slope_can_be() -> None:
    """Times at 64 and 50 samples that differ by about their noise: the law's fixed cost counts as known
    (the batches are 28% apart) but its time per sample is not measured, and its line is nearly flat.
    Below the worker's batch the policy prices it no flatter than that slope plus SLOPE_SDS standard
    errors: a solve that must bring the worker under a shorter round cuts it that much less."""
    ctl = build_policy(PolicyConfig(policy="auto", global_batch=128))
    assert isinstance(ctl, AutoPolicy)
    ctl.add_worker("a")
    ctl.add_worker("b")
    ctl.replan()
    wobble = [0.0, 1.0, -1.0, 0.5, -0.5, 0.2, -0.2, 0.0]
    for w in wobble:
        ctl.observe("a", 64, 40.0 + w)
        ctl.observe("b", 64, 40.0 + w)
    for w in wobble:
        ctl.observe("a", 50, 39.0 + w)
        ctl.observe("b", 78, 48.0 + w)
    finish = ctl._laws.finishes()["a"]
    line = finish.line
    assert ctl._identified("a") and not slope_measured(line)
    priced = ctl._times(current={"a": 50, "b": 78})["a"]
    steepest = line.q + SLOPE_SDS * math.sqrt(line.var_q)
    assert priced(50) == finish.cautious(50)
    for batch in (45, 40, 30, 10):
        assert priced(batch) <= priced(50) - steepest * (50 - batch) + 1e-9
        assert priced(batch) < finish.cautious(batch)
    assert ctl._times(current={"a": 50, "b": 78})["b"] == ctl._laws.finishes()["b"].cautious  # its slope is measured


def test_a_plan_that_keeps_the_workers_on_lines_through_the_origin_near_their_batches_rests_on_laws() -> None:
    """A worker measured at one batch size only (its law a line through the origin) does not make a
    plan a step as long as the plan keeps it within the deadband of its batch: its line runs through
    the times measured there. Moved by the deadband, or brought back from 0, it does."""
    ctl = build_policy(PolicyConfig(policy="auto", global_batch=300, deadband=0.1))
    assert isinstance(ctl, AutoPolicy)
    for k in "abc":
        ctl.add_worker(k)
    ctl.replan()
    wobble = [0.0, 0.5, -0.5, 0.3, -0.3, 0.0]
    for batch, ms in ((100, 60.0), (130, 75.0)):  # a: two batch sizes 30% apart, its law known
        for w in wobble:
            ctl.observe("a", batch, ms + w)
    for batch, ms in ((100, 50.0), (70, 38.0)):
        for w in wobble:
            ctl.observe("b", batch, ms + w)
    for w in wobble:
        ctl.observe("c", 100, 40.0 + w)
    assert ctl._identified("a") and ctl._identified("b") and not ctl._identified("c")
    current = {"a": 100, "b": 100, "c": 100}
    assert ctl._rests_on_laws({"a": 130, "b": 75, "c": 95}, current)
    assert not ctl._rests_on_laws({"a": 115, "b": 75, "c": 110}, current)
    assert not ctl._rests_on_laws({"a": 130, "b": 80, "c": 90}, current)
    assert not ctl._rests_on_laws({"a": 150, "b": 100, "c": 50}, {"a": 200, "b": 100, "c": 0})


@pytest.mark.slow
def test_a_thousand_workers_do_not_step_at_every_decision_after_a_change() -> None:
    """1,024 workers, B = 256 a worker, a fifth of them twice as slow or fast at round 100 (seed 1). When
    every plan with a worker on a line through the origin counted as a step, each decision after the
    change asked for the next at a step's bar, and from round 117 to 187 every one moved about 900
    workers on a predicted gain of 10-15% that never came: never steady again, the final plan at 1.10
    of the optimal round's compute (1.05 before the change). Now two steps re-balance it, and the
    re-solves after them move at most a few workers by the deadband (two each at rounds 122 and 132,
    with the many-worker standard errors of many_workers.py: steady after 7 decisions, 1.0506 of the
    optimum's compute; the laws' errors among a thousand workers, docs/scaling.md)."""
    trace = simulate(Scenario(policy="auto", workers=1024, global_batch=256 * 1024, rounds=160, seed=1,
                              events=[Event(100, "speed", fraction=0.2, factor=2.0)]))
    after = metrics.phase(trace, 100, 160)
    assert after["decisions_to_steady"] is not None and after["decisions_to_steady"] <= 8, after
    assert after["compute_over_optimum"] <= 1.06, after
    decisions = [d for d in trace.decisions if 100 <= d.round < 160]
    # no decision after the first two moves many workers by the deadband (a step moved about 900)
    moved = [int((abs(d.plan - before.plan) >= 0.1 * before.plan).sum() - (before.plan == 0).sum())
             for before, d in zip(decisions, decisions[1:])]
    assert moved[0] > 10 and all(m <= 10 for m in moved[1:]), moved

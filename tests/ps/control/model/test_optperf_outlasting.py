"""A worker kept at a few samples whose round the measured times show it sets: optperf.outlasting
picks it by the measured round (pure), and the model policy parks it at once instead of halving its
batch one re-solve at a time."""

from __future__ import annotations

import random

from ps.control.model.optperf import outlasting
from tests.model_policy_runs import check_plan, model
from tests.simulated_workers import run_rounds

LINES = {"fast": (0.003, 1.5), "slow": (0.25, 0.5), "mid": (0.01, 1.0)}
TIMES = {k: (lambda b, q=q, s=s: q * b + s) for k, (q, s) in LINES.items()}
BOUNDS = dict.fromkeys(LINES, 1), dict.fromkeys(LINES, 1024)


def pick(plan: dict[str, int], means: dict[str, float], measured: float, share: float = 0.1) -> list[str]:
    return outlasting(means, plan, TIMES, 1024, *BOUNDS, measured_round=measured, overhead=2.0, margin=0.1,
                      share=share)


def test_a_small_late_worker_is_picked_where_the_round_without_it_is_shorter() -> None:
    """'slow' holds 40 of 1,024 samples and finishes at 20 ms, the others at 5: without it 'fast' and 'mid'
    make 1,024 in about 4.8 ms plus c, well under the 22 ms measured."""
    plan = {"fast": 884, "slow": 40, "mid": 100}
    assert pick(plan, {"fast": 4.2, "slow": 20.0, "mid": 2.0}, measured=22.0) == ["slow"]


def test_no_worker_is_picked_where_the_measured_round_is_no_longer_than_the_others_make() -> None:
    plan = {"fast": 884, "slow": 40, "mid": 100}
    assert pick(plan, {"fast": 4.2, "slow": 20.0, "mid": 2.0}, measured=6.0) == []  # they make ~5.75


def test_neither_a_large_share_nor_the_carrying_worker_nor_an_on_time_one_is_picked() -> None:
    """A late worker with more than `share` of B is re-balanced, not parked; the worker with the largest
    batch carries the round; a worker within the margin of it is not late."""
    assert pick({"fast": 884, "slow": 40, "mid": 100}, {"fast": 4.2, "slow": 20.0, "mid": 2.0}, 22.0,
                share=0.03) == []
    assert pick({"fast": 500, "slow": 24, "mid": 500}, {"fast": 30.0, "slow": 6.0, "mid": 6.0}, 32.0) == []
    assert pick({"fast": 884, "slow": 40, "mid": 100}, {"fast": 4.2, "slow": 4.5, "mid": 2.0}, 22.0) == []


def test_two_late_workers_are_picked_together_where_one_alone_leaves_the_other_setting_the_round() -> None:
    times = {**TIMES, "slow2": lambda b: 19.0}  # its step is all fixed cost
    plan = {"fast": 844, "slow": 40, "slow2": 40, "mid": 100}
    means = {"fast": 4.2, "slow": 20.0, "slow2": 19.0, "mid": 2.0}
    picked = outlasting(means, plan, times, 1024, dict.fromkeys(plan, 1), dict.fromkeys(plan, 1024),
                        measured_round=22.0, overhead=2.0, margin=0.1, share=0.1)
    assert picked == ["slow", "slow2"]


def test_the_model_policy_parks_a_small_worker_whose_time_turned_flat_at_once() -> None:
    """'slow' runs 0.1 ms a sample until its quota makes every step 20 ms whatever its batch (a step that
    waits for its CPU period). Its fit, rescaled by the change, still asks for a smaller batch, and a
    re-solve may halve it once a decision: 44, 22, 11, 6, 3, 2, 1 and only then parked, 20 ms rounds all
    along where 'fast' alone makes 5.5. Priced by the measured round, it is parked by the second
    decision after the change."""
    costs = {"fast": (0.003, 1.5), "slow": (0.1, 0.0)}
    ctl = model(costs, 1024)
    rnd = random.Random(0)
    run_rounds(ctl, costs, 120, 0.02, rnd, 2.0, 10, check=check_plan)
    assert 20 <= ctl.plan()["slow"] <= 80
    flat = {"fast": (0.003, 1.5), "slow": (0.0, 20.0)}
    reports = run_rounds(ctl, flat, 60, 0.02, rnd, 2.0, 10, check=check_plan)
    parked_at = next(i for i, r in enumerate(reports) if r["plan"]["slow"] == 0)
    assert parked_at <= 1, [(r["phase"], r["plan"]) for r in reports]
    assert any(r.get("outlasting") == ["slow"] for r in reports[:parked_at + 1])


def test_a_solve_that_keeps_a_small_worker_is_checked_by_its_rounds_before_the_scheduled_decision() -> None:
    """Decisions scheduled an epoch apart (here never): the solve after the probes keeps 'slow' at a few
    dozen samples, and its steps turn out to take 20 ms whatever the batch. The policy asks for a
    decision once the plan's rounds are measured, and parks it there, not an epoch later."""
    costs = {"fast": (0.003, 1.5), "slow": (0.1, 0.0)}
    ctl = model(costs, 1024)
    rnd = random.Random(0)
    phases: list[str] = []
    while "solve" not in phases:  # a round at a time, to the first solve
        phases += [r["phase"] for r in run_rounds(ctl, costs, 1, 0.02, rnd, 2.0, 10**6, check=check_plan)]
        assert len(phases) < 10
    assert 20 <= ctl.plan()["slow"] <= 80
    flat = {"fast": (0.003, 1.5), "slow": (0.0, 20.0)}
    reports = run_rounds(ctl, flat, 30, 0.02, rnd, 2.0, 10**6, check=check_plan)
    assert ctl.plan()["slow"] == 0, reports
    assert reports[0].get("outlasting") == ["slow"]

"""The auto policy after a slowdown whose first time straddles it (the round began at the old speed):
the step it takes on that time gives the slowed worker no more than the optimum would. Pure, on
simulated BSP rounds."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from ps.control.config import PolicyConfig
from ps.control.model.optperf import best_plan
from ps.control.policy import build_policy
from tests.simulated_workers import HL8_MEASURED, Costs, optimum, round_of

OVERHEAD = 55.0


def across_change(seed: int, before: Costs, after: Costs, straddle: Callable[[str, random.Random], float | None],
                  rounds: int) -> tuple[list[tuple[float, dict[str, int]]], int]:
    """`before`'s costs run to a steady plan, then `after`'s from round 60, which is a change during a
    round: each worker's time of round 60 is `straddle(worker, rnd)` at the old speed (None: all at the
    new). The rounds from 60 on (time, plan before it) and the decisions from 60 on that changed the plan."""
    rnd = random.Random(seed)
    ctl = build_policy(PolicyConfig(policy="auto", global_batch=512))
    for k in before:
        ctl.add_worker(k)
    ctl.replan()
    times, changes = [], 0
    for r in range(rounds):
        plan, finishes = ctl.plan(), []
        for k, b in plan.items():
            if not b:
                continue
            q, s = (before if r < 60 else after)[k]
            t = q * b + s
            share = straddle(k, rnd) if r == 60 else None
            if share is not None:
                q0, s0 = before[k]
                t = share * (q0 * b + s0) + (1.0 - share) * t
            finishes.append(t * (1.0 + rnd.gauss(0.0, 0.03)))
            ctl.observe(k, b, finishes[-1])
        ctl.observe_round(max(finishes) + OVERHEAD)
        if r >= 60:
            times.append((max(finishes) + OVERHEAD, plan))
        if ctl.decision_due() or r % 10 == 9:
            ctl.adjust()
            changes += r >= 60 and ctl.plan() != plan
    return times, changes


def straddled_swap(seed: int, share_before: float) -> tuple[list[tuple[float, dict[str, int]]], Costs]:
    """HL8 run to a steady plan, then w3 and w2 swap quotas during a round: that round's times of both
    are `share_before` at the old speed, the rest at the new. The rounds after (time, plan before it)."""
    after = {**HL8_MEASURED, "w3": HL8_MEASURED["w2"], "w2": HL8_MEASURED["w3"]}
    rounds, _ = across_change(seed, HL8_MEASURED, after, lambda k, rnd: share_before if k in ("w2", "w3") else None, 120)
    return rounds, after


@pytest.mark.parametrize("seed", range(4))
def test_a_slowdown_trusted_on_a_straddled_time_does_not_hold_the_round(seed: int) -> None:
    """w3 (a core, then an eighth) takes its straddled first time as four to five times slower where it
    is about seven: stepped on that time alone it got 135-151 samples and every round took 1.7-1.9 s,
    three times the optimum's; taken as that many times slower again (no slower a sample than w2 ran
    before), its time at the step's batch stays within the others' (w2's straddled time holds them
    long), and the rounds that follow take at most 2.5 times the optimum's. The straddled time stays in
    w3's law (admitted beside the step's times) and tilts it flat, a fixed cost of 570 ms where it is
    212: solved from it, the next decision cut w3 to 0-2 samples, where the optimum gives it 33, and
    took until the end of the run to come back; below the step's batch w3 is now priced no lower than
    in proportion to it, and gets 28-30."""
    rounds, after = straddled_swap(seed, share_before=0.45)
    best = optimum(after, 512) + OVERHEAD
    plans = [p for _, p in rounds]
    changes = [p for p, before in zip(plans[1:], plans) if p != before]
    step = changes[0]
    q, s = after["w3"]
    assert q * step["w3"] + s <= max(after[k][0] * b + after[k][1] for k, b in step.items() if k != "w3" and b), step
    times = {k: (lambda b, q=q, s=s: q * b + s) for k, (q, s) in after.items()}
    optimal, _, _ = best_plan(times, 512, dict.fromkeys(after, 1), dict.fromkeys(after, 512), may_park=list(after))
    assert all(p["w3"] >= 0.75 * optimal["w3"] for p in changes[1:]), (changes, optimal)
    assert all(t <= 2.5 * best for t, _ in rounds[1:]), [round(t / best, 2) for t, _ in rounds]
    assert round_of(after, plans[-1]) + OVERHEAD <= 1.05 * best, plans[-1]


@pytest.mark.parametrize("seed", range(4))
def test_a_slowdown_whose_first_time_shows_all_of_it_is_stepped_near_the_optimum(seed: int) -> None:
    """The same swap between two rounds: w3's first time shows the whole slowdown (7.4 times), and that
    many times slower again took it for 55 times slower, an eighth of a core for a 64th: its step gave
    it 8-9 samples where the optimum gives it 33. No slower a sample than the slowest worker measured
    (w2, before the swap), it gets 40-41, and the next decision settles it."""
    rounds, after = straddled_swap(seed, share_before=0.0)
    plans = [p for _, p in rounds]
    step = next(p for p in plans[1:] if p != plans[0])
    times = {k: (lambda b, q=q, s=s: q * b + s) for k, (q, s) in after.items()}
    optimal, _, _ = best_plan(times, 512, dict.fromkeys(after, 1), dict.fromkeys(after, 512), may_park=list(after))
    assert 0.75 * optimal["w3"] <= step["w3"] <= 1.5 * optimal["w3"], (step, optimal)
    changes = sum(a != b for a, b in zip(plans, plans[1:]))
    assert changes <= 2 and round_of(after, plans[-1]) + OVERHEAD <= 1.05 * (optimum(after, 512) + OVERHEAD), plans


HL8_SHARES = {"w0": 3 / 16, "w1": 3 / 16, "w2": 1 / 8, "w3": 1.0}
HL1_MEASURED = {k: (q * HL8_SHARES[k] / 0.375, s * HL8_SHARES[k] / 0.375) for k, (q, s) in HL8_MEASURED.items()}
"""HL1 (every worker at 3/8 of a core): HL8's laws scaled by the change of share."""


def plan_changes_after_every_quota_changes(seed: int) -> int:
    """HL1 run to a steady plan, then every worker's quota changes to HL8's during a round (each
    worker's time of that round a random part at the old speed): the plan changes in the 50 rounds after."""
    _, changes = across_change(seed, HL1_MEASURED, HL8_MEASURED, lambda k, rnd: rnd.uniform(0.1, 0.9), 110)
    return changes


def test_when_every_quota_changes_in_a_round_most_runs_re_balance_in_two_plan_changes() -> None:
    """The step on the new times, then the solve: each worker's two times at the batch it had, 1.5-1.7
    times the step's, enter its law (law.ADMIT_SPREAD_TWICE), a time that straddles the change does
    not (worker_laws.py). 16 seeds: a third plan change in 3 (in 11 with those times left out of the
    law until 2x away), never a fourth."""
    changes = [plan_changes_after_every_quota_changes(seed) for seed in range(16)]
    assert max(changes) <= 3 and sum(c > 2 for c in changes) <= 6, changes


def within_the_deadband(costs: Costs, plan: dict[str, int]) -> bool:
    """Whether every active worker finishes within 10% of the plan's round (the benchmark's balance)."""
    finish = [costs[k][0] * b + costs[k][1] for k, b in plan.items() if b]
    return min(finish) >= 0.9 * max(finish)


def test_after_a_straddled_swap_a_worker_held_early_is_raised() -> None:
    """The straddled swap above, 20 seeds: the solve after the step leaves w1 (an eighth of its time
    fixed cost) finishing 11-14% early, a round 2.5-3.7% longer than the laws' optimum, under half the
    deadband a re-solve must gain. Its times measure it idle too, by more than the noise and by
    MIN_GAIN of the workers' time: the re-solve then needs only the laws' own bar, and raises it to its
    solved batch (model/optperf.nearest_plan). Held, 17 of 20 seeds never came within ±10% in the 60
    rounds after the swap, and the last 30 rounds ran at 1.041 of the optimum's; raised, 1 of 20 and
    1.023."""
    after = {**HL8_MEASURED, "w3": HL8_MEASURED["w2"], "w2": HL8_MEASURED["w3"]}
    best = optimum(after, 512) + OVERHEAD
    never, late = 0, []
    for seed in range(20):
        rounds, _ = straddled_swap(seed, share_before=0.45)
        never += not any(within_the_deadband(after, plan) for _, plan in rounds)
        late.append(sum(t for t, _ in rounds[-30:]) / 30 / best)
    assert never <= 3, never
    assert sum(late) / len(late) <= 1.03, late


def test_a_re_solve_of_a_plan_measured_far_out_of_balance_waits_for_no_confirmation() -> None:
    """The straddled swap above, 20 seeds. The decision after the step's solve finds the plan measured
    far out of balance (imbalance.py) and the laws' gain above its bar: the times are the confirmation,
    so it installs the solve at once instead of holding for a second decision to find the same. Every
    worker is within ±10% of the round from the 10th round after the swap in 18 seeds, from the 20th in
    the other two; held for confirmation, from the 20th in 18 and never in the other two."""
    after = {**HL8_MEASURED, "w3": HL8_MEASURED["w2"], "w2": HL8_MEASURED["w3"]}
    first = []
    for seed in range(20):
        rounds, _ = straddled_swap(seed, share_before=0.45)
        first.append(next((i for i, (_, plan) in enumerate(rounds) if within_the_deadband(after, plan)), None))
    assert all(f is not None and f <= 20 for f in first), first
    assert sum(f is not None and f <= 10 for f in first) >= 15, first

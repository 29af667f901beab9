"""ps.control.auto.policy when a change of speed lands inside a decision's window, on simulated BSP
rounds with noise in spells (a shared machine's load): two workers at a third and two thirds of a
core swap speeds a few rounds before a decision. The failure it guards against: the decision at the
swap stepped from times on both sides of it, each worker's law was then fitted through a point from
each side (the sped-up worker's times fell as its batch rose, so its line came out flat), and the
solve saw no gain in a plan measured 52 against 22 ms, and held it for good."""

from __future__ import annotations

import math
import random
from typing import Any

from ps.control.auto.imbalance import far_from_balance
from ps.control.config import PolicyConfig
from ps.control.policy import build_policy
from tests.simulated_workers import Costs, optimum, round_of

BEFORE: Costs = {"w0": (0.8, 3.0), "w1": (0.4, 3.0)}
AFTER: Costs = {"w0": (0.4, 3.0), "w1": (0.8, 3.0)}
TOTAL = 128
EVERY = 8
"""A decision every this many rounds, and whenever the policy asks."""
SPELL_NOISE, SPELL_CORRELATION, STALLS = 0.15, 0.8, 0.05


def swapped(seed: int, offset: int) -> list[float]:
    """One run: 40 + `offset` rounds of BEFORE, 60 of AFTER; each phase's last plan's round over the
    phase's optimum."""
    rnd = random.Random(seed)
    load = dict.fromkeys(BEFORE, 0.0)
    ctl: Any = build_policy(PolicyConfig(policy="auto", global_batch=TOTAL))
    for k in BEFORE:
        ctl.add_worker(k)
    ctl.replan()
    ratios = []
    for costs, rounds in ((BEFORE, 40 + offset), (AFTER, 60)):
        for r in range(rounds):
            finishes = []
            for k, b in ctl.plan().items():
                load[k] = SPELL_CORRELATION * load[k] + math.sqrt(1 - SPELL_CORRELATION ** 2) * rnd.gauss(0, SPELL_NOISE)
                if b > 0:
                    slowdown = math.exp(load[k]) * (2.0 if rnd.random() < STALLS else 1.0)
                    t = (costs[k][0] * b + costs[k][1]) * slowdown
                    finishes.append(t)
                    ctl.observe(k, b, t)
            ctl.observe_round(max(finishes) + 2.0)
            if ctl.decision_due() or r % EVERY == EVERY - 1:
                ctl.adjust()
        ratios.append(round_of(costs, ctl.plan()) / optimum(costs, TOTAL))
    return ratios


def test_a_swap_inside_a_decision_window_is_seldom_held_far_from_balance() -> None:
    """20 seeds, the swap at each of the 8 rounds of a window: the plan at the end of the swapped phase
    is within 1.3 of its optimum in all but two of these 160 runs (4 were held at 1.32-1.47, each at
    64/64 or near it, before the policy stepped plans measured far out of balance). Not in every run:
    spells of load and stalls can hold a plan whose gain is within the noise of its times, and over
    seeds 40-119 (640 runs) 15 end above 1.3."""
    ends = {(seed, offset): swapped(seed, offset)[1] for seed in range(20) for offset in range(EVERY)}
    held = {run: round(ratio, 3) for run, ratio in ends.items() if ratio > 1.3}
    assert len(held) <= 2 and max(ends.values()) < 1.5, held


def _history(ms: float, noise: float, n: int = 12, seed: int = 0) -> list[tuple[int, int, float, None]]:
    rnd = random.Random(seed)
    return [(i, 64, ms * (1.0 + rnd.gauss(0.0, noise)), None) for i in range(n)]


def test_far_from_balance_counts_a_gap_beyond_the_width_and_the_noise() -> None:
    plan, lower, upper = {"a": 64, "b": 64}, {"a": 1, "b": 1}, {"a": 128, "b": 128}
    quiet = {"a": _history(22.0, 0.03), "b": _history(52.0, 0.03, seed=1)}
    times = {k: [ms for _, _, ms, _ in items[-8:]] for k, items in quiet.items()}
    assert far_from_balance(times, quiet, plan, lower, upper, 0.2)
    # the same means over times this noisy are not far: a spell of load may make such a gap
    noisy = {"a": _history(22.0, 0.5), "b": _history(52.0, 0.5, seed=1)}
    assert not far_from_balance({"a": [22.0] * 3, "b": [52.0] * 3}, noisy, plan, lower, upper, 0.2)
    # within the width, or late only where its lower bound holds it: not far
    assert not far_from_balance({"a": [22.0] * 8, "b": [25.0] * 8}, quiet, plan, lower, upper, 0.2)
    assert not far_from_balance(times, quiet, plan, {"a": 1, "b": 64}, upper, 0.2)
    # one worker inside its bounds is no balance to judge
    assert not far_from_balance(times, quiet, plan, {"a": 64, "b": 1}, {"a": 64, "b": 128}, 0.2)

"""ps.control.auto.policy when a worker planned at its minimum batch speeds up as the other slows, on
simulated BSP rounds (a third and two thirds of a core whose step is mostly fixed cost, as the e2e
speed-change test measured them). The failure it guards against: the change was trusted on its first
times, before any worker had `min_samples` times in force at its batch, so the decision that found it
had no measured times to probe with; the sped-up worker's law was a line through the origin at batch
1 (its time there all fixed cost), which priced any larger batch far too high, and every decision
after that, the change no longer new, held the plan with that worker at 1."""

from __future__ import annotations

import random
from typing import Any

from ps.control.config import PolicyConfig
from ps.control.policy import build_policy
from tests.simulated_workers import Costs, run_rounds

BEFORE: Costs = {"w0": (0.27, 17.0), "w1": (0.015, 14.3)}
"""w0 slow and mostly fixed cost, planned at a batch of a few samples; w1 almost all fixed cost."""
AFTER: Costs = {"w0": (0.1, 8.0), "w1": (0.2, 12.0)}
TOTAL = 128


def swap(seed: int) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """One run: 60 rounds of BEFORE, 80 of AFTER, 5% noise, a decision every 12 rounds and whenever
    the policy asks; the plan at the swap and the decisions after it."""
    rnd = random.Random(seed)
    ctl: Any = build_policy(PolicyConfig(policy="auto", global_batch=TOTAL))
    for k in BEFORE:
        ctl.add_worker(k)
    ctl.replan()
    run_rounds(ctl, BEFORE, 60, noise=0.05, rnd=rnd, every=12)
    at_swap = ctl.plan()
    return at_swap, run_rounds(ctl, AFTER, 80, noise=0.05, rnd=rnd, every=12)


def test_a_worker_at_its_minimum_that_speeds_up_is_moved_up_from_every_seed() -> None:
    """60 seeds, most of which plan w0 at 1-4 samples before the swap: after it w0 carries most of B in
    every run, and is first moved up within two decisions of the swap (6 of these 60 runs held w0 at
    its batch for good when a change found before times were in force could not be probed)."""
    runs = {seed: swap(seed) for seed in range(60)}
    assert sum(at_swap["w0"] <= 2 for at_swap, _ in runs.values()) >= 20  # the case is exercised
    stuck = {seed: (at_swap, decisions[-1]["plan"]) for seed, (at_swap, decisions) in runs.items()
             if decisions[-1]["plan"]["w0"] < TOTAL // 2}
    assert not stuck, stuck
    late = {seed: [(d["round"], d.get("phase"), d["plan"]["w0"]) for d in decisions[:4]]
            for seed, (at_swap, decisions) in runs.items()
            if not any(d["plan"]["w0"] > max(at_swap["w0"], 1) for d in decisions[:2])}
    assert not late, late

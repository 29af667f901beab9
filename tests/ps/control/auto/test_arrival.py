"""ps.control.auto.arrival and the auto policy over a server that takes pushes one at a time: the
slowest worker takes the earliest slot, the slots span at most a share of the round, and a policy
told the server's time a push staggers the finishes and shortens the queued round (pure)."""

from __future__ import annotations

import random
from collections.abc import Mapping

import pytest

from ps.control.auto.arrival import SPAN, offsets, planned, shifted, slot_ms
from ps.control.model.time_fit import Finish, Line
from tests.simulated_workers import HL_SPEEDS, Costs, auto_policy, speed_map

HL8_SLOW = {k: (10.0 / s, 0.0) for k, s in speed_map(HL_SPEEDS["HL8"]).items()}
"""HL8's shares, time proportional to the batch, rounds of about 100 ms at B = 512."""
PUSH_MS = 4.0
"""The simulated server's time a push."""


def test_the_gap_is_the_server_time_a_push_within_its_share_of_the_round() -> None:
    assert slot_ms(4.0, 160.0, 4) == 4.0
    assert slot_ms(4.0, 24.0, 4) == SPAN * 24.0 / 3
    assert slot_ms(4.0, 160.0, 1) == slot_ms(0.0, 160.0, 4) == slot_ms(4.0, 0.0, 4) == 0.0


def test_the_slowest_worker_takes_the_earliest_slot_and_the_parked_none() -> None:
    plan = {"fast": 300, "mid": 60, "slow": 20, "parked": 0}
    per_sample = {"fast": 0.3, "mid": 1.5, "slow": 5.0, "parked": 1.0}
    out = offsets(plan, lambda k, b: per_sample[k] * b + 10.0, 3.0)
    assert out == {"fast": 0.0, "mid": 3.0, "slow": 6.0}
    finishes = {k: Finish(Line(q, 10.0)) for k, q in per_sample.items() if k != "mid"}
    assert planned(plan, finishes, 3.0, 160.0) == {"fast": 0.0, "slow": 3.0}  # "mid" has no fit: no slot
    assert offsets(plan, lambda k, b: 1.0, 0.0) == {}
    assert shifted({"slow": [1.0, 2.0], "fast": [4.0]}, {"slow": 6.0}) == {"slow": [7.0, 8.0], "fast": [4.0]}
    assert shifted(None, {"slow": 6.0}) is None


def queued(finishes: Mapping[str, float], push_ms: float) -> float:
    """The round a server closes taking the pushes in the order they arrive, `push_ms` each."""
    t = 0.0
    for f in sorted(finishes.values()):
        t = max(t, f) + push_ms
    return t


def run(costs: Costs, push_ms: float, told_ms: float, rounds: int = 120, seed: int = 0) -> dict[str, int]:
    """The auto policy's plan after `rounds` queued rounds, told `told_ms` as the server's time a push."""
    rnd = random.Random(seed)
    ctl = auto_policy(costs, 512)
    for r in range(rounds):
        finishes = {}
        for k, b in ctl.plan().items():
            if b > 0:
                q, s = costs[k]
                finishes[k] = (q * b + s) * (1.0 + rnd.gauss(0.0, 0.02))
                ctl.observe(k, b, finishes[k])
        ctl.observe_round(queued(finishes, push_ms) + 1.0, told_ms)
        if ctl.decision_due() or r % 10 == 9:
            ctl.adjust()
    return ctl.plan()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_policy_told_the_time_a_push_staggers_the_finishes_and_shortens_the_queued_round(seed: int) -> None:
    def finish_times(plan: Mapping[str, int]) -> dict[str, float]:
        return {k: HL8_SLOW[k][0] * b + HL8_SLOW[k][1] for k, b in plan.items() if b > 0}

    blind, told = run(HL8_SLOW, PUSH_MS, 0.0, seed=seed), run(HL8_SLOW, PUSH_MS, PUSH_MS, seed=seed)
    assert sum(told.values()) == 512
    at = finish_times(told)
    assert at["w3"] - at["w2"] >= 2 * PUSH_MS  # the slowest ahead of the fastest by most of its slots
    assert queued(at, PUSH_MS) < 0.975 * queued(finish_times(blind), PUSH_MS)  # 3.5-7% shorter over seeds 0-7

"""The adaptive batch's choice from any start (ps/control/global_batch/goodput.py with the model
policy's pricing of a global batch): simulated workers with fixed + per-sample time laws, one of them
slow with a large fixed share, a simulated noise scale with its standard error, and measured rounds
with noise. Pure."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping

import pytest

from ps.control.config import PolicyConfig
from ps.control.global_batch.decider import TAKE_BACK_MEMORY, AdaptiveBatch
from ps.control.global_batch.goodput import AdaptiveConfig, Decision
from ps.control.model.break_even import below_break_even, park_below_break_even
from ps.control.model.optperf import best_plan
from ps.control.model.policy import ModelPolicy
from ps.control.performance import FinishTime
from ps.control.policy import build_policy, with_global_batch
from tests.simulated_workers import run_rounds

COSTS = {"a": (0.2, 8.0), "b": (0.2, 8.0), "c": (0.2, 8.0), "slow": (0.6, 40.0)}
"""(q ms per sample, s ms fixed): three fast workers and one slow whose break-even is 67 samples."""
OVERHEAD = 2.0
PHI = 1000.0
LOWER, UPPER = 32, 4096
DECISIONS = 3
"""Decisions within which the choice is within 25% of B*: a move, the measurement of the batch moved
to, and a margin for a noisy φ."""


def law(q: float, s: float) -> FinishTime:
    return lambda b: q * b + s


LAWS = {k: law(q, s) for k, (q, s) in COSTS.items()}


def true_plan(total: int) -> dict[str, int]:
    """The plan of the simulated cluster at `total`: the best split, parking where it pays and below break-even."""
    bounds = dict.fromkeys(LAWS, 1), dict.fromkeys(LAWS, total)
    plan, _, _ = best_plan(LAWS, total, *bounds, may_park=list(LAWS), overhead=OVERHEAD)
    return park_below_break_even(LAWS, LAWS, plan, *bounds, list(LAWS))[0]


def true_round(total: int) -> float:
    return max(LAWS[k](b) for k, b in true_plan(total).items() if b > 0) + OVERHEAD


def true_goodput(total: int) -> float:
    return total / true_round(total) / (PHI + total)  # ∝ throughput × E(B), whatever B₀


B_STAR = max(range(LOWER, UPPER + 1), key=true_goodput)


def fitted_policy() -> ModelPolicy:
    """A model policy with --adaptive-batch's break-even parking, fitted on simulated rounds at B = 256."""
    ctl = build_policy(PolicyConfig(policy="model", global_batch=256, break_even=True))
    assert isinstance(ctl, ModelPolicy)
    for k in COSTS:
        ctl.add_worker(k)
    ctl.replan()
    run_rounds(ctl, COSTS, 60, 0.02, random.Random(0), OVERHEAD, 10)
    return ctl


def decide(ab: AdaptiveBatch, rng: random.Random, predict: Callable[[int], float], rounds: dict[int, float],
           noise: Mapping[int, float]) -> Decision:
    """One decision at a φ measured with 10% noise (its standard error 10%), as the server makes it:
    the review of the last move first, else the goodput scan; applied, and the rounds at the new B measured."""
    phi = PHI * (1.0 + rng.gauss(0.0, 0.1))
    decision = ab.review(phi, rounds, noise, predict) or ab.choose(phi, LOWER, UPPER, predict, phi_sd=0.1 * phi)
    ab.apply(decision)
    rounds[ab.batch] = true_round(ab.batch) * (1.0 + rng.gauss(0.0, 0.01))
    return decision


def test_the_simulated_optimum_is_inside_the_bounds_and_the_slow_worker_counts() -> None:
    assert 4 * LOWER <= B_STAR <= UPPER // 4
    assert true_plan(B_STAR)["slow"] == 0 and true_plan(UPPER)["slow"] > 0


@pytest.mark.parametrize("start", [B_STAR // 4, B_STAR, 4 * B_STAR])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_choice_reaches_the_optimum_from_either_side_and_stays(start: int, seed: int) -> None:
    ctl = fitted_policy()
    predict = ctl.predicted_round_ms
    ab = AdaptiveBatch(AdaptiveConfig(base_batch=start, min_batch=LOWER, max_batch=UPPER))
    rng = random.Random(seed)
    rounds: dict[int, float] = {start: true_round(start)}
    batches = []
    for _ in range(12):
        decide(ab, rng, lambda b: predict(b) or float("inf"), rounds, {b: 0.01 for b in rounds})
        batches.append(ab.batch)
    near = [abs(b - B_STAR) <= 0.25 * B_STAR for b in batches]
    assert all(near[DECISIONS - 1:]), (B_STAR, start, batches)
    for b in set(batches):  # the plan the policy installs at every B visited: no active worker below break-even
        plan = with_global_batch(ctl, b).plan()
        assert sum(plan.values()) == b
        assert not any(below_break_even(LAWS[k], n) for k, n in plan.items() if n > 0), (b, plan)


def test_a_move_the_measured_goodput_contradicts_is_taken_back_and_its_direction_closed() -> None:
    """A round model that counts every cost as per-sample (T ∝ B) sees no loss of throughput at a small
    B, so its scan moves B down; the rounds measured there contradict it."""
    start = B_STAR
    per_sample = true_round(start) / start

    def wrong(b: int) -> float:
        return per_sample * b

    ab = AdaptiveBatch(AdaptiveConfig(base_batch=start, min_batch=LOWER, max_batch=UPPER))
    rng = random.Random(0)
    rounds: dict[int, float] = {start: true_round(start)}
    noise = dict.fromkeys(range(LOWER, UPPER + 1), 0.01)
    first = decide(ab, rng, wrong, rounds, noise)
    assert first.changed and first.batch < start and first.reason == "goodput"
    back = decide(ab, rng, wrong, rounds, noise)
    assert back.changed and back.batch == start and back.reason == "taken back: measured goodput fell"
    closed = [decide(ab, rng, wrong, rounds, noise) for _ in range(TAKE_BACK_MEMORY)]
    assert all(not d.changed and ab.batch == start for d in closed)
    assert ab.closed == {}  # open again: the wrong model moves B down once more, and is taken back again
    again = decide(ab, rng, wrong, rounds, noise)
    assert again.changed and again.batch < start
    assert decide(ab, rng, wrong, rounds, noise).batch == start


def test_a_loss_within_the_rounds_noise_is_no_contradiction() -> None:
    ab = AdaptiveBatch(AdaptiveConfig(base_batch=256, min_batch=LOWER, max_batch=UPPER))
    ab.apply(Decision(512, 256, True, 0.1, PHI, None, None, "goodput"))
    rounds = {256: 100.0, 512: 200.0 * (PHI + 256) / (PHI + 512) / 0.98}  # goodput 2% below; the rounds' noise 2% each
    assert ab.review(PHI, rounds, {256: 0.02, 512: 0.02}) is None and ab.previous is None
    ab.apply(Decision(1024, 512, True, 0.1, PHI, None, None, "goodput"))
    assert ab.review(PHI, {**rounds, 1024: 1e6}, {}) is not None and ab.closed == {"up": [512, TAKE_BACK_MEMORY]}

"""The default policy against `dynamic` and `model` on the three kinds of cluster, simulated: time
proportional to the batch (HL8), a fixed cost per step (HL8 with one; a worker that only slows the
round), and speeds that change (OmniLearn's Fig. 10 schedule of shares with a fixed cost; the fastest
and a slow worker swapping); with 2% noise, and some with noise that comes in spells, as a shared
machine's load does. For each: each phase's steady round over that phase's optimum, the mean
round over the whole run over the optimum, and the plan changes until steady. `auto` is
within 2% of the better of the two on the rounds in every regime (where the noise comes in spells,
on the mean round), and needs about as many decisions."""

from __future__ import annotations

import math
import random
import statistics
from typing import Any

import pytest

from ps.control.config import PolicyConfig
from ps.control.policy import build_policy
from tests.simulated_workers import HL_SPEEDS, Costs, optimum, round_of, run_rounds, speed_map

HL8 = {k: (1.0 / s, 0.0) for k, s in speed_map(HL_SPEEDS["HL8"]).items()}
HL8_FIXED = {"w0": (6.0, 80.0), "w1": (6.0, 80.0), "w2": (9.0, 120.0), "w3": (0.8, 20.0)}
SLOW_FIXED = {"w0": (0.2, 5.0), "w1": (0.2, 5.0), "w2": (0.2, 5.0), "w3": (0.8, 120.0)}
SHARES = {"hl1": (0.375, 0.375, 0.375, 0.375), "hl2": (0.375, 0.375, 0.25, 0.5),
          "hl4": (0.28, 0.28, 0.19, 0.75), "hl8": (0.19, 0.19, 0.125, 1.0)}
FIG10: list[Costs] = [{f"w{i}": (2.0 / share, 20.0 / share) for i, share in enumerate(SHARES[name])}
         for name in ("hl1", "hl2", "hl4", "hl8", "hl8", "hl4", "hl2", "hl1")]
"""Fig. 10's phases: every worker's (q, s) scaled by its CPU share."""
SWAP: list[Costs] = [HL8_FIXED, {**HL8_FIXED, "w2": HL8_FIXED["w3"], "w3": HL8_FIXED["w2"]}, HL8_FIXED]

QUICK_START = {"w0": (0.05, 9.0), "w1": (0.05, 9.0), "w2": (0.05, 9.0), "w3": (0.2, 40.0)}

REGIMES: dict[str, tuple[list[Costs], int, bool]] = {
    "proportional": ([HL8], 512, False),
    "fixed-cost": ([HL8_FIXED], 512, False),
    "parking": ([SLOW_FIXED], 256, False),
    "fig10": (FIG10, 512, False),
    "swap": (SWAP, 512, False),
    "proportional-in-spells": ([HL8], 512, True),
    "quick-start-in-spells": ([QUICK_START], 256, True),
    "fig10-in-spells": (FIG10, 512, True),
}
"""Each regime's phases, global batch, and whether the noise comes in spells (else 2% white noise)."""
SPELL_NOISE, SPELL_CORRELATION, STALLS = 0.15, 0.8, 0.05
"""Noise in spells: each worker's slowdown a lag-one autoregression (15% sd, correlation 0.8: a
machine's load lasts several rounds), and one step in 20 stalled at twice its time."""
SEEDS = 4
ROUNDS = 48
"""Rounds per phase (a decision every 8, and whenever the policy asks)."""


def simulate(name: str, phases: list[Costs], total: int, seed: int, spells: bool = False) -> dict[str, Any]:
    """One run of the policy `name` through `phases`: per phase, its steady round over the optimum
    (the mean over its last quarter, re-probes of a parked worker included) and the plan changes (a
    re-probe and the decision measuring it aside); over the run, the mean round over the optimum."""
    rnd = random.Random(seed)
    load = dict.fromkeys(phases[0], 0.0)
    ctl = build_policy(PolicyConfig(policy=name, global_batch=total))
    for k in phases[0]:
        ctl.add_worker(k)
    ctl.replan()
    finals, changes, ratios = [], [], []
    for costs in phases:
        best, count, last = optimum(costs, total), 0, None
        for r in range(ROUNDS):
            finishes = []
            for k, b in ctl.plan().items():
                load[k] = SPELL_CORRELATION * load[k] + math.sqrt(1 - SPELL_CORRELATION ** 2) * rnd.gauss(0, SPELL_NOISE)
                if b > 0:
                    slowdown = math.exp(load[k]) * (2.0 if rnd.random() < STALLS else 1.0) if spells \
                        else 1.0 + rnd.gauss(0.0, 0.02)
                    t = (costs[k][0] * b + costs[k][1]) * slowdown
                    finishes.append(t)
                    ctl.observe(k, b, t)
            ctl.observe_round(max(finishes) + 2.0)
            ratios.append(round_of(costs, ctl.plan()) / best)
            if ctl.decision_due() or r % 8 == 7:
                before = ctl.plan()
                ctl.adjust()
                phase = ctl.report().get("phase")
                count += ctl.plan() != before and phase != "reprobe" and last != "reprobe"
                last = phase if phase != "wait" else last
        finals.append(statistics.fmean(ratios[-ROUNDS // 4:]))
        changes.append(count)
    return {"finals": finals, "mean": statistics.fmean(ratios), "changes": changes}


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, list[dict[str, Any]]]]:
    return {regime: {name: [simulate(name, phases, total, seed, spells) for seed in range(SEEDS)]
                     for name in ("dynamic", "model", "auto")}
            for regime, (phases, total, spells) in REGIMES.items()}


@pytest.mark.parametrize("regime", list(REGIMES))
def test_the_default_is_within_two_percent_of_the_better_policy_on_every_kind_of_cluster(
        results: dict[str, dict[str, list[dict[str, Any]]]], regime: str) -> None:
    runs = results[regime]

    def steady(name: str) -> float:  # each run's worst phase, over the seeds
        return statistics.fmean(max(run["finals"]) for run in runs[name])

    def mean_round(name: str) -> float:
        return statistics.fmean(run["mean"] for run in runs[name])

    # in spells the last quarter of a run is the luck of where a spell or a parked worker's re-probe
    # falls (its round is 3x the optimum in the quick start's shape): there the run's mean round decides
    if not REGIMES[regime][2]:
        assert steady("auto") <= 1.02 * min(steady("dynamic"), steady("model")), runs
    assert mean_round("auto") <= 1.02 * min(mean_round("dynamic"), mean_round("model")), runs


@pytest.mark.parametrize("regime", list(REGIMES))
def test_the_default_needs_no_more_decisions_than_the_better_policy(
        results: dict[str, dict[str, list[dict[str, Any]]]], regime: str) -> None:
    """Plan changes per phase, summed over the seeds: at most one a run more than the policy that
    reached the better mean round needed, and with 2% noise at most 2 in any phase."""
    runs = results[regime]
    better = min(("dynamic", "model"), key=lambda name: statistics.fmean(run["mean"] for run in runs[name]))
    total = {name: sum(sum(run["changes"]) for run in runs[name]) for name in runs}
    assert total["auto"] <= total[better] + SEEDS, total
    if not REGIMES[regime][2]:
        assert all(count <= 2 for run in runs["auto"] for count in run["changes"]), runs["auto"]


@pytest.mark.parametrize("seed", range(SEEDS))
def test_each_change_of_shares_takes_one_plan_change_near_the_optimum(seed: int) -> None:
    """Fig. 10's shares with 2% noise: at each change the phase's first plan change lands within 5% of
    its optimum, and no other follows. A worker found changed is priced by its law from before the
    change scaled through its new times (pricing.shaped), which holds where a share scales its time per
    sample and its fixed cost alike; priced by the proportional line through those times instead, the
    first plans were up to 6.5% off and 3 of these 24 changes took a second plan change."""
    rnd = random.Random(seed)
    ctl = build_policy(PolicyConfig(policy="auto", global_batch=512))
    for k in FIG10[0]:
        ctl.add_worker(k)
    ctl.replan()
    run_rounds(ctl, FIG10[0], ROUNDS, rnd=rnd, every=8)
    for before, costs in zip(FIG10, FIG10[1:]):
        changes = [r for r in run_rounds(ctl, costs, ROUNDS, rnd=rnd, every=8) if r["changed_plan"]]
        assert len(changes) <= (1 if costs != before else 0), changes
        if changes:
            assert round_of(costs, changes[0]["plan"]) <= 1.05 * optimum(costs, 512), changes

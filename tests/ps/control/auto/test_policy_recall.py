"""ps.control.auto.policy: a parked worker brought back into the plan (recalled when an active worker
slowed, or re-probed) comes back at a batch that measures its speed, on simulated BSP rounds of
workers whose step is mostly fixed cost at a batch of 1-2. The failure it guards against: quotas of a
quarter and three quarters of a core swapped while the slow worker was parked; recalled at batch 1,
its time there all fixed cost, its law priced it as slow and held it at a few samples while it was
the fast worker. And the other way: a recalled worker that is still slow is parked again at the
decision that measures it."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from ps.control.policy import policy_from_state, reconfigured
from tests.simulated_workers import QUICK_START, auto_policy, parked_then, run_rounds


def quota(share: float) -> tuple[float, float]:
    """(q, s) of a worker with `share` of a core: 0.01 ms a sample and 8 ms a step on a whole core."""
    return 0.01 / share, 8.0 / share


QUOTAS = {"a": quota(0.75), "d": quota(0.25)}
"""Three quarters and a quarter of a core: `d`'s fixed cost alone outlasts `a`'s round of all of B."""
@pytest.mark.parametrize("seed", range(6))
def test_a_worker_recalled_after_a_swap_of_quotas_takes_the_larger_batch_within_two_decisions(seed: int) -> None:
    """Recalled at batch 1 it was held at 1-5 samples for three to five decisions, or for good."""
    after = {"a": QUOTAS["d"], "d": QUOTAS["a"]}
    reports = parked_then(QUOTAS, after, "d", 64, seed)
    assert reports[0]["phase"] == "reprobe" and reports[0]["speed_changed"] == ["a"]
    plans = [(r["plan"]["d"], r["plan"]["a"]) for r in reports]
    assert plans[1][0] > plans[1][1] and plans[-1][0] > plans[-1][1], plans
    assert plans[0][0] >= 16, plans  # a quarter of B at least: a batch whose time is not all fixed cost


@pytest.mark.parametrize("seed", range(3))
def test_a_worker_recalled_while_others_absorb_the_slowdown_comes_back_at_its_share(seed: int) -> None:
    """Two alike workers take up what the slowed one leaves, so the solved round stays short and the
    recalled worker's law from before parking finishes only its minimum within it: it comes back at
    what that law finishes within the round measured now, and within two decisions carries as much as
    the workers it is now alike with. The slowed worker is parked within two decisions: where the
    recalled one is priced by its law's shape from before the swap (pricing.shaped), parking the
    slowed one may first gain less than MIN_GAIN by the laws, until its time at its minimum batch is
    measured."""
    after = {**QUICK_START, "w0": QUICK_START["w3"], "w3": QUICK_START["w0"]}
    reports = parked_then(QUICK_START, after, "w3", 256, seed)
    for plan in (reports[1]["plan"], reports[-1]["plan"]):
        assert plan["w3"] >= 0.8 * min(plan["w1"], plan["w2"]), plan
    assert reports[2]["plan"]["w0"] == 0 and reports[-1]["plan"]["w0"] == 0, reports[:3]
    assert reports[0]["plan"]["w3"] >= 64, reports[0]["plan"]


@pytest.mark.parametrize("seed", range(3))
def test_a_recalled_worker_that_is_still_slow_is_parked_again_by_the_decision_that_measures_it(seed: int) -> None:
    """A tenant makes `w0` five times slower; the parked `w3` is recalled at the batch its law
    finishes within that slowed round, keeps its speed, and the next decision parks it again."""
    after = {**QUICK_START, "w0": (0.25, 45.0)}
    reports = parked_then(QUICK_START, after, "w3", 256, seed)
    recall, measured = reports[0], reports[1]
    assert recall["phase"] == "reprobe" and recall["round"] <= 4
    assert measured["round"] - recall["round"] <= 8 and measured["plan"]["w3"] == 0, measured
    assert all(r["plan"]["w3"] <= 1 for r in reports[1:] if r["phase"] != "reprobe")


@pytest.mark.parametrize("seed", range(3))
def test_a_worker_far_slower_than_the_others_is_reprobed_at_a_few_samples(seed: int) -> None:
    """`w7`, 300 times slower a sample, is parked after the equal split, measured there alone: its law
    is a line through the origin. At its cores' share of B each re-probe round took 9.6 s against a
    planned round of 40 ms; near what its line finishes within the round, one of 1-2 samples takes
    about 0.15 s, and its time there gives it its fixed cost."""
    costs = {**{f"w{i}": (0.5, 2.0) for i in range(7)}, "w7": (150.0, 2.0)}
    ctl = auto_policy(costs, 512)
    reports = run_rounds(ctl, costs, 300, rnd=random.Random(seed), every=5)
    reprobes = [r for r in reports if r["phase"] == "reprobe"]
    assert reprobes and ctl.parked() == ["w7"], [r["plan"] for r in reports[:5]]
    assert all(r["plan"]["w7"] <= 2 for r in reprobes), [r["plan"] for r in reprobes]


def test_a_recall_brings_a_worker_back_by_a_flat_law_at_its_share_not_at_most_of_b() -> None:
    """256 simulated workers of three classes, a fifth changing speed at round 150: the recall that
    followed brought a worker whose law was fitted flat (times at batches 1-2: 21 ms, q not measured)
    back at 13,328 of B = 16,384, a round 338 times the optimum's. A flat law's time per sample is no
    measure of its speed: the worker comes back at its share, as one without a law."""
    from benchmarks.simulation.engine import Event, Scenario, simulate
    from benchmarks.simulation.population import SpeedLaw, parse_classes

    law = SpeedLaw(classes=parse_classes("a:0.1:5:2,b:0.4:20:1,c:2:60:1"))
    scenario = Scenario(policy="auto", workers=256, global_batch=64 * 256, seed=1, rounds=158, law=law,
                        events=(Event(150, "speed", fraction=0.2, factor=2.0),))
    trace = simulate(scenario)
    assert max(trace.round_ms[150:]) < 20 * trace.optimum_at(150).round_ms


def test_a_forgiven_parked_worker_planned_in_by_new_settings_leaves_no_forgiving_behind() -> None:
    """Settings that plan a parked worker in (no parking) carry the laws over, and the forgiving of
    its debt goes with its parking: the state stays one the policy reads back."""
    ctl = auto_policy(QUICK_START, 256)
    run_rounds(ctl, QUICK_START, 60, rnd=random.Random(0))
    assert ctl.parked() == ["w3"]
    state = json.loads(json.dumps(ctl.state_dict()))
    state["auto"]["parking"]["forgiven"] = ["w3"]
    resumed = reconfigured(policy_from_state(state), replace(ctl.config, park=False))
    assert resumed.plan()["w3"] > 0
    assert policy_from_state(json.loads(json.dumps(resumed.state_dict()))).plan() == resumed.plan()

"""Tests for the break-even parking (ps.control.model.break_even) and the model policy's plan and
pricing of a global batch with it (--adaptive-batch); pure, on simulated timings."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import pytest

from ps.control.config import PolicyConfig
from ps.control.model.policy import ModelPolicy
from ps.control.model.break_even import (below_break_even, break_even_batch, carrying, compute_share,
                                         park_below_break_even, raised_to_break_even)
from ps.control.performance import FinishTime, split
from ps.control.policy import build_policy, with_global_batch
from ps.control.worker_plan import WorkerPlan
from tests.simulated_workers import run_rounds


def line(q: float, s: float) -> FinishTime:
    return lambda b: q * b + s


def test_a_worker_is_below_its_break_even_where_its_fixed_part_exceeds_its_compute() -> None:
    law = line(1.0, 10.0)  # break-even at 10 samples
    assert below_break_even(law, 1) and below_break_even(law, 9)
    assert not below_break_even(law, 10) and not below_break_even(law, 50)
    assert not below_break_even(law, 0)  # parked
    assert not below_break_even(line(1.0, 0.0), 1) and compute_share(line(1.0, 0.0), 1) == float("inf")


def test_the_break_even_batch_and_the_floor_it_sets_for_a_worker_brought_back() -> None:
    assert break_even_batch(line(1.0, 10.0), 100) == 10 and break_even_batch(line(1.0, 10.5), 100) == 11
    assert break_even_batch(line(1.0, 10.0), 6) == 6 and break_even_batch(line(1.0, 0.0), 100) == 1
    laws = {"slow": line(1.0, 30.0)}
    lower, upper = {"a": 1, "slow": 1}, {"a": 100, "slow": 100}
    assert raised_to_break_even(laws, lower, upper, ["slow", "a"], 64) == {"a": 1, "slow": 30}
    assert raised_to_break_even(laws, lower, upper, ["slow"], 20) == lower  # the floor would not fit in B


def test_a_worker_planned_below_its_break_even_is_parked_and_its_share_split_over_the_others() -> None:
    times = {"a": line(0.2, 5.0), "b": line(0.2, 5.0), "slow": line(1.0, 30.0)}
    lower, upper = dict.fromkeys(times, 1), dict.fromkeys(times, 1000)
    plan = split(times, 60, lower, upper)
    assert 0 < plan["slow"] < 30  # the split alone keeps it at a few samples
    parked_plan, parked = park_below_break_even(times, times, plan, lower, upper, list(times))
    assert parked == ["slow"] and parked_plan["slow"] == 0 and sum(parked_plan.values()) == 60
    assert not any(below_break_even(times[k], b) for k, b in parked_plan.items())
    # not a candidate, or no law: kept
    assert park_below_break_even(times, times, plan, lower, upper, ["a", "b"]) == (plan, [])
    assert park_below_break_even(times, {"a": times["a"]}, plan, lower, upper, list(times)) == (plan, [])


def test_the_last_worker_and_a_rest_that_cannot_make_up_the_total_are_kept() -> None:
    times = {"a": line(1.0, 100.0), "b": line(1.0, 100.0)}
    lower, upper = dict.fromkeys(times, 1), dict.fromkeys(times, 1000)
    plan, parked = park_below_break_even(times, times, {"a": 20, "b": 20}, lower, upper, list(times))
    # one left, below its break-even still: of two equal shares the first named carries the round
    assert parked == ["b"] and plan == {"a": 40, "b": 0}
    capped = {"a": 1000, "b": 25}
    assert park_below_break_even(times, times, {"a": 20, "b": 20}, lower, capped, ["a"]) == ({"a": 20, "b": 20}, [])


def test_the_worker_carrying_the_round_is_never_parked_for_its_break_even() -> None:
    """The teacher MLP on HL8: the full-core worker's fixed cost is above its compute at most of B, and
    parking it would leave the round to a 3/16-core worker at 40 times its time."""
    times = {"fast": line(0.0032, 4.1), "slow": line(0.40, 2.5), "slower": line(0.18, 5.8)}
    lower, upper = dict.fromkeys(times, 1), dict.fromkeys(times, 512)
    plan, parked = park_below_break_even(times, times, {"fast": 486, "slow": 10, "slower": 16}, lower, upper,
                                         list(times))
    assert parked == ["slower"] and plan["slower"] == 0 and plan["fast"] > 400  # below its break-even of 1,282
    assert carrying(plan) == "fast" and carrying({"a": 0, "b": 0}) is None


COSTS = {"a": (0.2, 5.0), "b": (0.2, 5.0), "c": (0.2, 5.0), "d": (0.4, 15.0)}
"""(q, s): d's fixed cost is under the round the others reach without it, but its break-even is 37 samples
and the best split of 256 gives it about 15."""


def run(ctl: WorkerPlan, costs: dict[str, tuple[float, float]], rounds: int) -> list[dict]:
    """Simulated BSP rounds (t = q·b + s, 2% noise, 2 ms overhead), a decision every 10; the reports."""
    return run_rounds(ctl, costs, rounds, 0.02, random.Random(0), 2.0, 10)


def policy(name: str, break_even: bool) -> WorkerPlan:
    ctl = build_policy(PolicyConfig(policy=name, global_batch=256, break_even=break_even))
    assert isinstance(ctl, WorkerPlan)
    for k in COSTS:
        ctl.add_worker(k)
    ctl.replan()
    return ctl


@pytest.mark.parametrize("name", ["model", "auto"])
def test_the_policies_park_below_break_even_with_the_adaptive_batch_only(name: str) -> None:
    held = run(policy(name, False), COSTS, rounds=40)
    assert 0 < held[-1]["plan"]["d"] < 37
    reports = run(policy(name, True), COSTS, rounds=40)
    first = next(i for i, r in enumerate(reports) if r["plan"]["d"] == 0)
    after = reports[first:]  # a re-probe brings d back to be measured, at its break-even; the decision after parks it
    assert all(r["plan"]["d"] == 0 for r in after if r["phase"] != "reprobe")
    reprobes = [r for r in after if r["phase"] == "reprobe"]
    assert reprobes and all(r["plan"]["d"] >= 37 for r in reprobes)
    assert all(sum(r["plan"].values()) == 256 for r in reports)


def test_a_global_batch_is_priced_with_the_workers_its_plan_parks() -> None:
    ctl = policy("model", True)
    assert isinstance(ctl, ModelPolicy)
    run(ctl, COSTS, rounds=40)
    c = ctl.overhead_ms
    without_d = (256 / 3) * 0.2 + 5.0  # the three fast workers alone
    assert ctl.predicted_round_ms(256) == pytest.approx(without_d + c, rel=0.05)
    assert ctl.predicted_round_ms(3000) == pytest.approx(3000 / (3 / 0.2 + 1 / 0.4) * 1.0 + 9.0 + c, rel=0.1)


SMALL_B = {"a": (0.1, 5.0), "b": (2.0, 40.0), "c": (2.0, 40.0), "d": (2.0, 40.0)}
"""(q, s): b, c and d break even at 20 samples each; B = 48 has room to bring back two of them there,
not three."""


@pytest.mark.parametrize("name", ["model", "auto"])
def test_a_re_probe_brings_back_only_the_workers_the_total_has_room_for_at_their_break_even(name: str) -> None:
    """The others stay parked for a later re-probe: brought back at 1-10 samples, each ran a round of its
    fixed cost for a few samples (seen in benchmarks.tta from B0 = 128: B = 42, a worker at batch 1)."""
    ctl = build_policy(PolicyConfig(policy=name, global_batch=48, break_even=True))
    for k in SMALL_B:
        ctl.add_worker(k)
    ctl.replan()
    reports = run_rounds(ctl, SMALL_B, 200, 0.02, random.Random(0), 2.0, 10)
    reprobes = [r for r in reports if r["phase"] == "reprobe"]
    assert reprobes, [r["phase"] for r in reports]
    for r in reprobes:
        slow = {k: b for k, b in r["plan"].items() if k != "a" and b > 0}
        assert slow and all(b >= 18 for b in slow.values()), r["plan"]  # 20 by the laws, fitted within the noise
    assert all(sum(r["plan"].values()) == 48 for r in reports)


@pytest.mark.parametrize("name", ["auto"])  # the model policy, probed at batch 1, re-probes none of them here
def test_a_re_probe_never_crowds_out_an_active_worker(name: str) -> None:
    """B = 40 has room for two slow workers at their break-even (20 each) and nothing left for the fast
    one, which carries B alone: re-probes fit in what the active workers leave at their own break-even
    (seen in benchmarks.tta from B0 = 512: at B = 32 a re-probe of two slow workers parked the fastest)."""
    costs = {"a": (0.1, 1.0), "b": (2.0, 40.0), "c": (2.0, 40.0), "d": (2.0, 40.0)}
    ctl = build_policy(PolicyConfig(policy=name, global_batch=40, break_even=True))
    for k in costs:
        ctl.add_worker(k)
    ctl.replan()
    reports = run_rounds(ctl, costs, 200, 0.02, random.Random(0), 2.0, 10)
    assert any(r["phase"] == "reprobe" for r in reports), [r["phase"] for r in reports]
    settled = [r for r in reports if r["round"] >= 30]
    assert settled and all(r["plan"]["a"] >= 10 for r in settled), [(r["round"], r["plan"]) for r in settled
                                                                     if r["plan"]["a"] < 10]


TTA_B55 = {"a": (7.15, 41.0), "b": (23.8, 460.0), "c": (32.5, 473.0), "d": (37.2, 1000.0)}
"""(q, s) of the four workers of benchmarks.tta at B = 55 (HL8, the patterns CNN): a alone takes B in
~430 ms; b, c and d break even at 20, 15 and 27 samples, and any of them in the round makes it ~1 s."""


@pytest.mark.parametrize("name", ["model", "auto"])
def test_a_re_probe_the_round_measures_slower_is_parked_again_at_the_next_decision(name: str) -> None:
    """A worker brought back for a re-probe and measured slower than the plan it left is parked again at
    the decision that judges it, whoever else is due then (seen in benchmarks.tta from B0 = 512: a re-probe
    at B = 55 took rounds from 450 ms to 1.1 s, and the policy held it for an epoch)."""
    ctl = build_policy(PolicyConfig(policy=name, global_batch=55, break_even=True))
    for k in TTA_B55:
        ctl.add_worker(k)
    ctl.replan()
    reports = run_rounds(ctl, TTA_B55, 400, 0.02, random.Random(0), 12.0, 10)
    slow = ("b", "c", "d")
    judged = [(r, after) for r, after in zip(reports, reports[1:])
              if r["phase"] == "reprobe" and r["round"] >= 40]
    assert judged, [(r["round"], r["phase"], r["plan"]) for r in reports]
    for r, after in judged:
        assert all(after["plan"][k] == 0 for k in r["reprobe"]), (r["round"], r["plan"], after["phase"], after["plan"])
    settled = [r for r in reports if r["round"] >= 40 and r["phase"] != "reprobe"]
    assert all(all(r["plan"][k] == 0 for k in slow) for r in settled), [(r["round"], r["phase"], r["plan"])
                                                                       for r in settled]


def small_batch_penalty(worker: str, batch: int) -> float:
    """A finish time whose fixed cost grows below 8 samples (seen in benchmarks.tta: a worker at 3
    samples took 321 ms where its law from 42-98 samples gave 187): `a` fast, the others alike and slow."""
    if worker == "a":
        return 7.0 * batch + 2.0
    return 35.0 * batch + 82.0 + (150.0 if batch < 8 else 0.0)


@pytest.mark.parametrize("name", ["model", "auto"])
def test_a_re_probe_measured_slower_than_the_plan_it_left_never_stays_in_the_round(name: str) -> None:
    """B moves from 512 to 36 (--adaptive-batch): laws fitted at ~60 samples put the slow workers'
    break-even at 2-8 samples, where a re-probe runs rounds ~1.7 times the fast worker's alone. The
    decision that judges a re-probe measured slower than the plan it left by more than the deadband
    parks every re-probed worker again (a re-solve, or the plan taken back)."""
    ctl = build_policy(PolicyConfig(policy=name, global_batch=512, break_even=True))
    for k in "abcd":
        ctl.add_worker(k)
    ctl.replan()
    rnd, reports = random.Random(0), []
    for r in range(400):
        if r == 40:
            ctl = with_global_batch(ctl, 36)
        finishes = []
        for k, b in ctl.plan().items():
            if b:
                finishes.append(small_batch_penalty(k, b) * (1.0 + rnd.gauss(0.0, 0.02)))
                ctl.observe(k, b, finishes[-1])
        ctl.observe_round(max(finishes) + 10.0)
        if ctl.decision_due() or r % 10 == 9:
            ctl.adjust()
            reports.append({**ctl.report(), "plan": ctl.plan(), "round": r})
    decided = [r for r in reports if r["phase"] != "wait"]
    judged = [(r, after) for r, after in zip(decided, decided[1:]) if r["phase"] == "reprobe"]
    slower = [(r, after) for r, after in judged
              if after["previous"]["measured_round_ms"] > 1.1 * r["previous"]["measured_round_ms"]]
    assert slower, [(r["round"], r["phase"], r["plan"]) for r in decided]
    for r, after in slower:
        assert all(after["plan"][k] == 0 for k in r["reprobe"]), (r["round"], r["plan"], after["phase"], after["plan"])
    assert all(sum(r["plan"].values()) == 36 for r in reports if r["round"] >= 40)


TTA_B45 = {"a": (18.9, 97.0), "b": (19.6, 87.9), "c": (36.5, 115.2), "d": (2.7, 42.7)}
"""(q, s) of benchmarks.tta's workers at B = 45 (HL8, the patterns CNN, adaptive from B0 = 64): a, b and
c break even at 6, 5 and 4 samples, d carries most of B."""


@pytest.mark.parametrize("name", ["model", "auto"])
@pytest.mark.parametrize("total", [45, 60, 71])
def test_no_plan_keeps_an_active_worker_below_its_break_even(name: str, total: int) -> None:
    """Neither a solve nor a re-probe, nor the move toward the plan in force after either (the nearest
    plan within the gain's slack), leaves a worker in the round below its break-even by the laws the
    decision reports: the benchmark's own check (benchmarks.analysis.below_break_even)."""
    from benchmarks.analysis import below_break_even as reported_below

    ctl = build_policy(PolicyConfig(policy=name, global_batch=total, break_even=True))
    for k in TTA_B45:
        ctl.add_worker(k)
    ctl.replan()
    reports = run_rounds(ctl, TTA_B45, 300, 0.05, random.Random(1), 2.0, 5)
    events = [{"event": "adjust", "step": r["round"], "phase": r["phase"], "batch_sizes": r["plan"],
               "fits": r.get("fits")} for r in reports]
    assert any(r["phase"] in ("solve", "reprobe") for r in reports)
    assert reported_below(events) == []
    assert all(sum(r["plan"].values()) == total for r in reports)


E2E_LAWS = {"a": (0.09, 2.0), "b": (0.16, 5.0), "c": (0.05, 23.0)}
"""(q, s) of the loopback job of tests/e2e/test_adaptive_batch_probe.py (digits, the MLP, slowdowns 1, 2
and 8): c's step is almost all fixed cost, its break-even ~460 samples."""
E2E_FOUR = {"a": (7.15, 41.0), "b": (23.8, 460.0), "c": (32.5, 473.0), "d": (37.2, 1000.0)}


def run_with_global_batches(name: str, costs: Mapping[str, tuple[float, float]], seed: int,
                            batches: Mapping[int, int], rounds: int = 80) -> list[dict[str, Any]]:
    """`adjust` events of the policy from B = 128 (--adaptive-batch), B moved to `batches[r]` before round
    r, a decision whenever asked and every 4 rounds, and every plan a B makes (a replan)."""
    rnd = random.Random(seed)
    ctl: Any = build_policy(PolicyConfig(policy=name, global_batch=128, break_even=True, min_samples=2))
    for k in costs:
        ctl.add_worker(k)
    ctl.replan()
    events = []
    for r in range(rounds):
        if r in batches:
            ctl = with_global_batch(ctl, batches[r])
            events.append({"event": "adjust", "step": r, **ctl.report(), "batch_sizes": ctl.plan()})
        finishes = []
        for k, b in ctl.plan().items():
            if b:
                q, s = costs[k]
                finishes.append((q * b + s) * (1.0 + rnd.gauss(0.0, 0.05)))
                ctl.observe(k, b, finishes[-1])
        ctl.observe_round(max(finishes) + 1.0)
        if ctl.decision_due() or r % 4 == 3:
            ctl.adjust()
            events.append({"event": "adjust", "step": r, **ctl.report(), "batch_sizes": ctl.plan()})
    return events


@pytest.mark.parametrize(("name", "costs", "seed", "batches"), [
    ("model", E2E_LAWS, 3, {5: 64, 11: 179}),  # a probe and a replan before every law was known
    ("model", E2E_LAWS, 4, {6: 64, 8: 179}),  # the re-solve judging a re-probe, its trust bounds too tight to park
    ("auto", E2E_LAWS, 0, {3: 64, 9: 179}),  # a parked worker brought back crowding out the others
    ("auto", E2E_LAWS, 2, {5: 64, 14: 179, 19: 100}),  # a step from the measured times, far from balance
    ("auto", E2E_FOUR, 1, {2: 32, 10: 400, 20: 400}),
])
def test_no_plan_made_without_a_solve_puts_a_worker_with_a_known_law_below_its_break_even(
        name: str, costs: Mapping[str, tuple[float, float]], seed: int, batches: Mapping[int, int]) -> None:
    """Probes, replans by measured speeds, parked workers brought back and steps from the measured times
    park a worker their plan puts below its break-even by its known law, or keep it there, as a solve
    does (seen in the loopback job of tests/e2e: a probe left c at batch 1, its break-even 148)."""
    from benchmarks.analysis import below_break_even as reported_below

    events = run_with_global_batches(name, costs, seed, batches)
    assert reported_below(events) == [], [(e["step"], e.get("phase"), e["batch_sizes"]) for e in events]
    assert all(sum(e["batch_sizes"].values()) == [128, *batches.values()][sum(r <= e["step"] for r in batches)]
               for e in events)
    parked = [e for e in events if e.get("phase") in ("probe", "replan", "step") and e.get("parked")]
    assert name == "auto" or parked  # the model's probe or replan parked c


@pytest.mark.parametrize("name", ["auto", "model"])
def test_a_replan_without_the_fits_keeps_the_parked_workers_parked(name: str) -> None:
    """A worker joining, or --adaptive-batch moving B before a law is fitted at it, replans by measured
    speeds; the workers a solve parked stay parked where the others make B up. Brought back, the two
    workers of 13 ms of fixed cost took a sample each and set every round at four times the fast one's
    (seen on HL8 with the digits MLP from B = 16: B moved 56 → 70 and w0, w1 ran at 1 sample for 48 rounds)."""
    costs = {"fast": (0.1, 1.0), "s1": (0.02, 13.0), "s2": (0.02, 13.0)}
    ctl: Any = build_policy(PolicyConfig(policy=name, global_batch=32, break_even=True, min_samples=2))
    for k in costs:
        ctl.add_worker(k)
    ctl.replan()
    run_rounds(ctl, costs, 60, 0.03, random.Random(0))
    assert ctl.plan() == {"fast": 32, "s1": 0, "s2": 0}
    ctl.add_worker("new", 1.0)
    joined = ctl.replan()
    assert ctl.report()["phase"] == "replan" and joined["s1"] == joined["s2"] == 0 and joined["new"] > 0, joined
    moved = with_global_batch(ctl, 40).plan()
    assert moved["s1"] == moved["s2"] == 0 and sum(moved.values()) == 40, moved
    # where the others cannot make B up, the parked come back
    for k in ("fast", "new"):
        ctl.remove_worker(k)
    alone = ctl.replan()
    assert alone["s1"] > 0 and alone["s2"] > 0 and sum(alone.values()) == 32, alone

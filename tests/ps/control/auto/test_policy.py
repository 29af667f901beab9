"""ps.control.auto, the default policy, on simulated BSP rounds: a proportional cluster split as fast as
by `dynamic`, a fixed per-step cost solved and a slow worker parked as by `model`, a change of speed
detected and re-planned with the points before it forgotten, noise that moves neither the plan nor
the change test, and its state through a checkpoint."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any

import pytest

from ps.control.auto.change import CHANGE_ROUNDS
from ps.control.auto.policy import AutoPolicy
from ps.control.config import PolicyConfig
from ps.control.policy import build_policy, policy_from_state, reconfigured
from tests.simulated_workers import (HL_SPEEDS, Costs, assert_decides_alike, balanced, optimum, round_of, run_rounds,
                                     speed_map)

HL8 = {k: (1.0 / s, 0.0) for k, s in speed_map(HL_SPEEDS["HL8"]).items()}
"""OmniLearn's HL8 shares, time proportional to the batch."""
HL8_FIXED = {"w0": (6.0, 80.0), "w1": (6.0, 80.0), "w2": (9.0, 120.0), "w3": (0.8, 20.0)}
"""HL8-like speeds with a fixed cost per step."""
SLOW_FIXED = {"a": (0.2, 5.0), "b": (0.2, 5.0), "c": (0.2, 5.0), "d": (0.8, 120.0)}
"""Three alike workers and one whose fixed cost alone outlasts their round: it only slows the round."""
QUICK_START = {"w0": (0.05, 9.0), "w1": (0.05, 9.0), "w2": (0.05, 9.0), "w3": (0.2, 40.0)}
"""The quick start's shape: nearly all fixed cost, the slope below what ±10% noise lets two batch
sizes measure, and a slow worker that cannot pay for itself."""


def policy(name: str, costs: Costs, total: int, **config: Any) -> Any:
    ctl = build_policy(PolicyConfig(policy=name, global_batch=total, **config))
    for k in costs:
        ctl.add_worker(k)
    ctl.replan()
    return ctl


def swapped(costs: Costs, a: str, b: str) -> dict[str, tuple[float, float]]:
    return {**costs, a: costs[b], b: costs[a]}


def slowed(costs: Costs, worker: str, factor: float) -> dict[str, tuple[float, float]]:
    q, s = costs[worker]
    return {**costs, worker: (q * factor, s * factor)}


def plan_changes(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The decisions that changed the plan, less a parked worker's re-probes and the decision that
    measured each."""
    out, last = [], None
    for r in reports:
        if r["changed_plan"] and r.get("phase") != "reprobe" and last != "reprobe":
            out.append(r)
        if r.get("phase") not in (None, "wait"):
            last = r.get("phase")
    return out


def test_auto_is_the_default_of_both_front_doors() -> None:
    from deploy.emulator import DEFAULT_POLICY
    from ps.server_flags import build_parser

    assert PolicyConfig().policy == "auto"
    assert build_parser().parse_args([]).policy == "auto"  # ps-server
    assert DEFAULT_POLICY == "auto"  # ps-cluster run, on a profile and on a schedule


# ---------------------------------------------------------------- a proportional cluster


@pytest.mark.parametrize("name", list(HL_SPEEDS))
def test_a_proportional_cluster_is_split_within_the_deadband_in_as_few_decisions_as_dynamic(name: str) -> None:
    speeds = speed_map(HL_SPEEDS[name])
    costs = {k: (1.0 / s, 0.0) for k, s in speeds.items()}
    runs = {}
    for kind in ("dynamic", "auto"):
        ctl = policy(kind, costs, 512)
        run_rounds(ctl, costs, 80, noise=0.02)
        runs[kind] = ctl
    auto = runs["auto"]
    assert auto.adjustments <= runs["dynamic"].adjustments
    assert balanced(auto.plan(), speeds, 0.0, 0.1)
    assert round_of(costs, auto.plan()) <= 1.1 * optimum(costs, 512)
    assert sum(auto.plan().values()) == 512


def test_the_first_decision_is_the_proportional_step_and_comes_as_soon_as_the_times_are_measured() -> None:
    ctl = policy("auto", HL8, 512)
    reports = run_rounds(ctl, HL8, 30, noise=0.0, every=1000)  # only the decisions the policy asks for
    first = reports[0]
    assert first["phase"] == "step" and first["round"] < 10
    assert not any(f["law"] for f in first["fits"].values())  # one batch size each: proportional lines
    times = [b * HL8[k][0] for k, b in first["plan"].items()]
    assert max(times) <= 1.02 * min(times)  # equal times at the measured throughputs


def test_a_decisions_report_names_no_field_of_the_adjust_record_it_joins() -> None:
    """ps/rounds writes each decision as an `adjust` record of its own fields (the step, the plan,
    whether it changed, ...) and the policy's report: the two must not share a name."""
    ctl = policy("auto", SLOW_FIXED, 256)
    reports = run_rounds(ctl, SLOW_FIXED, 40)
    record = {"step", "epoch", "batch_sizes", "compute_ms", "changed", "adjustments"}
    assert reports and not any(set(r) - {"plan", "round", "changed_plan"} & record for r in reports)


# ---------------------------------------------------------------- a fixed per-step cost


def test_a_worker_whose_fixed_cost_only_slows_the_round_is_parked_like_the_model_does() -> None:
    reports = {kind: run_rounds(ctl := policy(kind, SLOW_FIXED, 256), SLOW_FIXED, 40) for kind in ("model", "auto")}
    auto = [r for r in reports["auto"] if r["changed_plan"]]
    assert [r["phase"] for r in auto[:2]] == ["step", "solve"]  # the step's second batch size finds the fixed cost
    solved = auto[1]
    assert solved["parked"] == ["d"] and solved["plan"]["d"] == 0
    assert solved["park"]["parked"] < solved["park"]["held"]
    assert solved["fits"]["d"]["s"] == pytest.approx(120.0, rel=0.15)
    model = [r for r in reports["model"] if r["changed_plan"]]
    assert auto[1]["round"] <= model[1]["round"]  # parked no later than the model (after its probe)
    best = optimum(SLOW_FIXED, 256)
    assert round_of(SLOW_FIXED, solved["plan"]) <= 1.02 * best
    held = policy("auto", SLOW_FIXED, 256, park=False)
    run_rounds(held, SLOW_FIXED, 40)
    assert held.parked() == [] and 1 <= held.plan()["d"] <= 3


def test_a_fixed_cost_is_solved_in_two_decisions_to_the_models_split() -> None:
    ctl = policy("auto", HL8_FIXED, 512)
    reports = run_rounds(ctl, HL8_FIXED, 80, noise=0.01)
    changes = plan_changes(reports)
    assert [r["phase"] for r in changes] == ["step", "solve"]
    model = policy("model", HL8_FIXED, 512)
    run_rounds(model, HL8_FIXED, 80, noise=0.01)
    best = optimum(HL8_FIXED, 512, park=False)
    assert round_of(HL8_FIXED, ctl.plan()) <= max(1.02 * round_of(HL8_FIXED, model.plan()), 1.05 * best)
    later = [r for r in reports if r["round"] > changes[-1]["round"] and r["previous"]["rounds"] >= 3]
    assert later and all(r["phase"] == "hold" for r in later)
    for r in later:  # the laws predict the rounds they hold
        prev = r["previous"]
        assert abs(prev["predicted_round_ms"] - prev["measured_round_ms"]) <= 0.05 * prev["measured_round_ms"]


def test_a_parked_worker_is_reprobed_and_comes_back_when_faster() -> None:
    costs = {"a": (0.2, 5.0), "b": (0.2, 5.0), "d": (0.8, 120.0)}
    ctl = policy("auto", costs, 128)
    reports = run_rounds(ctl, costs, 40)
    assert ctl.parked() == ["d"] and any(r["phase"] == "reprobe" for r in reports)
    run_rounds(ctl, {**costs, "d": (0.2, 5.0)}, 120)
    assert ctl.parked() == [] and ctl.plan()["d"] > 20


def test_a_fixed_cost_guessed_from_nearby_batch_sizes_parks_nobody() -> None:
    """Two batch sizes 5% apart cannot tell a fixed cost from noise: the law stays the proportional
    line, and no worker is parked on it."""
    ctl = build_policy(PolicyConfig(policy="auto", global_batch=256, min_samples=3))
    for k in ("a", "b"):
        ctl.add_worker(k)
    ctl.replan()
    rnd = random.Random(3)
    for batch in (128, 122):  # the worker's speed is 1 sample/ms; noise makes a large intercept plausible
        for _ in range(6):
            ctl.observe("a", batch, batch * (1 + rnd.gauss(0, 0.05)))
            ctl.observe("b", 256 - batch, (256 - batch) * 0.5)
    assert isinstance(ctl, AutoPolicy) and not ctl._identified("a")
    assert ctl.adjust() and ctl.parked() == []


def test_asp_splits_by_the_laws_and_never_parks() -> None:
    ctl = policy("auto", {"a": (0.2, 5.0), "d": (0.8, 200.0)}, 64, keep_global_sum=False)
    run_rounds(ctl, {"a": (0.2, 5.0), "d": (0.8, 200.0)}, 30)
    assert ctl.parked() == [] and all(b >= 1 for b in ctl.plan().values())
    assert ctl.plan()["a"] > ctl.plan()["d"]


# ---------------------------------------------------------------- speeds that change


def changed_at(reports: list[dict[str, Any]], start: int) -> dict[str, int]:
    """Each worker reported changed after round `start`, with the round of the first decision saying so."""
    found: dict[str, int] = {}
    for r in reports:
        for k in r.get("speed_changed") or []:
            if r["round"] >= start:
                found.setdefault(k, r["round"] - start)
    return found


@pytest.mark.parametrize("costs", [HL8, HL8_FIXED], ids=["proportional", "fixed-cost"])
@pytest.mark.parametrize("seed", range(3))
def test_the_fastest_and_a_slow_worker_swap_and_are_replanned_from_their_new_times(costs: Costs, seed: int) -> None:
    """The fastest worker's rounds become up to eleven times longer: its first time after the swap is
    trusted at once (change.QUICK), the step it takes is measured on min_samples times, not twice as
    many, and the time spent on plans more than 10% off the optimum is at most 8 optimal rounds (23 to
    33 when three times were needed, 11 on six after the step), within 10% of the optimum in two plan
    changes at most. With fixed costs the solve after the step cuts w3 no lower than in proportion to
    the step's batch (its law rests on the one time it was found on, which may straddle the swap), to
    1.06-1.09 of the optimum: a plan measured within the deadband, held there in two of three seeds,
    refined by a third plan change in one."""
    rnd = random.Random(seed)
    ctl = policy("auto", costs, 512)
    run_rounds(ctl, costs, 60, rnd=rnd)
    after = swapped(costs, "w3", "w2")
    plans: list[dict[str, int]] = []
    reports = run_rounds(ctl, after, 60, rnd=rnd, check=lambda c: plans.append(c.plan()))
    found = changed_at(reports, 0)
    assert {"w2", "w3"} <= set(found) and max(found["w2"], found["w3"]) <= CHANGE_ROUNDS + 2, found
    best = optimum(after, 512)
    changes = plan_changes(reports)
    balanced = [i for i, r in enumerate(changes) if round_of(after, r["plan"]) <= 1.1 * best]
    assert balanced and balanced[0] < 2 and len(changes) <= 3, [(r["round"], r["phase"]) for r in changes]
    off = [round_of(after, p) for p in plans if round_of(after, p) > 1.1 * best]
    assert sum(off) <= 8 * best, [round(t / best, 2) for t in off]
    within = 1.05 if costs is HL8 else 1.07
    assert round_of(after, changes[-1]["plan"]) <= within * best
    assert round_of(after, ctl.plan()) <= within * best
    # the points from before the swap are forgotten: every time the laws hold is the new speed's
    state = ctl.state_dict()["auto"]["workers"]
    for k in ("w2", "w3"):
        q, s = after[k]
        assert all(abs(ms / (q * b + s) - 1.0) < 0.1 for _, b, ms, _ in state[k]["obs"]), k
        fit = reports[-1]["fits"][k]
        b = ctl.plan()[k]
        assert fit["q"] * b + fit["s"] == pytest.approx(q * b + s, rel=0.05)


@pytest.mark.parametrize("costs", [HL8, HL8_FIXED], ids=["proportional", "fixed-cost"])
def test_a_tenant_arrives_and_leaves_a_workers_speed_halves_then_comes_back(costs: Costs) -> None:
    rnd = random.Random(1)
    ctl = policy("auto", costs, 512)
    run_rounds(ctl, costs, 60, rnd=rnd)
    for phase in (slowed(costs, "w3", 2.0), costs):
        reports = run_rounds(ctl, phase, 60, rnd=rnd)
        assert "w3" in changed_at(reports, 0)
        changes = plan_changes(reports)
        assert 1 <= len(changes) <= 2 and changes[-1]["round"] <= 20, [(r["round"], r["phase"]) for r in changes]
        assert round_of(phase, ctl.plan()) <= 1.05 * optimum(phase, 512)


def test_a_parked_worker_that_swapped_speeds_with_an_active_one_is_recalled_at_once() -> None:
    """A parked worker's speed is not measured: when an active worker changes speed (here they swap),
    every parked worker comes back for a probe at the next decision, not at its re-probe's backoff."""
    costs = {"a": (0.2, 5.0), "d": (0.8, 120.0)}
    ctl = policy("auto", costs, 64)
    run_rounds(ctl, costs, 80)
    assert ctl.parked() == ["d"]
    after = swapped(costs, "a", "d")
    reports = run_rounds(ctl, after, 40)
    found = changed_at(reports, 0)
    recall = next(r for r in reports if r.get("phase") == "reprobe")
    assert recall["round"] <= found["a"] + 1, (recall["round"], found)
    assert ctl.parked() == ["a"] and ctl.plan()["d"] == 64


def test_a_change_is_met_at_once_not_at_the_next_scheduled_decision() -> None:
    ctl = policy("auto", HL8, 512)
    run_rounds(ctl, HL8, 60, every=1000)
    reports = run_rounds(ctl, slowed(HL8, "w3", 2.0), 20, every=1000)
    assert reports and reports[0]["round"] <= CHANGE_ROUNDS + 1 and reports[0]["speed_changed"] == ["w3"]


# ---------------------------------------------------------------- noise


@pytest.mark.parametrize(("costs", "most"), [(HL8, 2), (HL8_FIXED, 3)], ids=["proportional", "fixed-cost"])
def test_five_percent_noise_moves_neither_the_plan_nor_the_change_test(costs: Costs, most: int) -> None:
    """10 seeds of 150 rounds: no worker is ever taken for changed; past the step, a plan change only
    refines the laws (each shortens the true round), and none comes after round 60."""
    best = optimum(costs, 512)
    for seed in range(10):
        ctl = policy("auto", costs, 512)
        reports = run_rounds(ctl, costs, 150, noise=0.05, rnd=random.Random(seed))
        assert not any(r.get("speed_changed") for r in reports), seed
        changes = plan_changes(reports)
        assert len(changes) <= most and changes[-1]["round"] <= 60, (seed, [(r["round"], r["phase"]) for r in changes])
        rounds = [round_of(costs, r["plan"]) for r in changes]
        assert rounds == sorted(rounds, reverse=True), seed
        assert round_of(costs, ctl.plan()) <= 1.1 * best  # within the deadband


@pytest.mark.parametrize(("costs", "total", "most"), [(QUICK_START, 256, 6), (HL8_FIXED, 512, 30), (HL8, 512, 5)],
                         ids=["quick-start", "fixed-cost", "proportional"])
def test_ten_percent_noise_seldom_moves_the_plan_or_takes_a_worker_for_changed(
        costs: Costs, total: int, most: int) -> None:
    """±10% noise on every step time, 10 seeds of 150 rounds: plan changes after the first two (the
    step and the solve; re-probes aside) within half of what the model policy's test allows its
    re-solves over 20 seeds, and a worker taken for changed less than once a run (measured: 2, 8 and
    1 moves; 3, 6 and 1 workers taken for changed)."""
    moves = alarms = 0
    for seed in range(10):
        reports = run_rounds(policy("auto", costs, total), costs, 150, noise=0.1, rnd=random.Random(seed))
        moves += max(0, len(plan_changes(reports)) - 2)
        alarms += sum(len(r.get("speed_changed") or []) for r in reports)
    assert moves <= most
    assert alarms < 10


# ---------------------------------------------------------------- state


def test_state_round_trips_and_resumes_under_other_settings() -> None:
    costs = {"a": (0.2, 5.0), "b": (0.2, 5.0), "d": (0.8, 120.0)}
    ctl = policy("auto", costs, 128)
    run_rounds(ctl, costs, 25)
    assert ctl.parked() == ["d"]
    state = json.loads(json.dumps(ctl.state_dict()))
    back = policy_from_state(state)
    assert isinstance(back, AutoPolicy)
    assert json.dumps(back.state_dict(), sort_keys=True) == json.dumps(state, sort_keys=True)
    # the slowest time per sample measured is kept; a state written without it reads as none measured
    assert state["auto"]["slowest"] > 0
    older = {**state, "auto": {k: v for k, v in state["auto"].items() if k != "slowest"}}
    assert policy_from_state(older).state_dict()["auto"]["slowest"] is None
    # the restored policy decides like the original (its first steps after the restore are warm-up)
    assert_decides_alike(run_rounds(back, costs, 30, rnd=random.Random(3)),
                         run_rounds(ctl, costs, 30, rnd=random.Random(3)), costs)
    # auto -> dynamic -> auto: the dynamic policy plans the parked worker in, the laws are gone
    dynamic = reconfigured(ctl, PolicyConfig(policy="dynamic", global_batch=128))
    assert dynamic.parked() == [] and sum(dynamic.plan().values()) == 128
    again = reconfigured(dynamic, ctl.config)
    assert again.parked() == [] and sum(again.plan().values()) == 128
    # --no-park on resume: the parked worker is planned in again, the laws carry over
    unparked = reconfigured(ctl, PolicyConfig(policy="auto", global_batch=128, park=False))
    assert unparked.parked() == [] and sum(unparked.plan().values()) == 128
    assert unparked.state_dict()["auto"]["workers"] == ctl.state_dict()["auto"]["workers"]


def test_a_change_trusted_on_its_first_time_keeps_that_batch_in_the_law_and_in_the_state() -> None:
    """The swap makes w3's first time eleven times its law's: the change is taken at once and that
    one time, at the batch w3 had, is admitted into its law with the times at the batch the step gives
    it, so the next decision solves from a known law; a checkpoint keeps it."""
    ctl = policy("auto", HL8_FIXED, 512)
    run_rounds(ctl, HL8_FIXED, 60, rnd=random.Random(0))
    before = ctl.plan()["w3"]
    after = swapped(HL8_FIXED, "w3", "w2")
    first = run_rounds(ctl, after, 1, rnd=random.Random(1))
    assert first and "w3" in first[0]["speed_changed"]
    state = json.loads(json.dumps(ctl.state_dict()))
    assert state["auto"]["workers"]["w3"]["admitted"] == before
    assert state["auto"]["workers"]["w3"]["lone"] is True  # found on that one time alone
    # the shape of its law before the swap (HL8_FIXED's w3: 20 ms a step at 0.8 ms a sample), for its price
    assert 15 < state["auto"]["workers"]["w3"]["shape"] < 35
    back = policy_from_state(state)
    assert json.dumps(back.state_dict(), sort_keys=True) == json.dumps(state, sort_keys=True)
    reports = run_rounds(ctl, after, 12, rnd=random.Random(2))
    solved = [r for r in reports if r["changed_plan"]]
    assert solved and solved[0]["phase"] == "solve" and solved[0]["fits"]["w3"]["law"], solved


def test_a_state_that_contradicts_itself_is_refused() -> None:
    costs = {"a": (0.2, 5.0), "b": (0.2, 5.0), "d": (0.8, 120.0)}
    ctl = policy("auto", costs, 128)
    run_rounds(ctl, costs, 25)
    state = ctl.state_dict()

    def broken(change: Mapping[str, Any]) -> dict[str, Any]:
        copy = json.loads(json.dumps(state))
        for path, value in change.items():
            *head, last = path.split("/")
            node = copy
            for key in head:
                node = node[key]
            if value is None:
                del node[last]
            else:
                node[last] = value
        return copy

    cases: list[tuple[dict[str, Any], str]] = [
        ({"auto/parking/parked": {}}, "not those at batch 0"),
        ({"auto/workers/d/settled": -1}, "settled mark"),
        ({"auto/changed": ["ghost"]}, "'changed' must list workers"),
        ({"auto/follow_up": "yes"}, "'follow_up' must be true or false"),
        ({"auto/measured": 3}, "'measured' must be a list"),
        ({"auto/workers/a/obs": [[0, 32, -1.0, None]]}, "observed ms"),
        ({"auto/confirming": None}, "must have the keys"),
        ({"auto/slowest": -1.0}, "slowest must be >= 0"),
        ({"auto/stray": 1}, "may have \\['slowest'\\]"),
        ({"auto/workers/a/admitted": 0}, "admitted batch of 'a'"),
        ({"auto/workers/a/stray": 1}, "may have admitted, lone"),
        ({"auto/workers/a/lone": True}, "'lone' of 'a' must be true, beside an admitted batch"),
        ({"auto/workers/a/shape": 0.0}, "'shape' of 'a' must be > 0"),
        ({"auto/workers/a/shape": "wide"}, "'shape' of 'a' must be a number"),
        ({"auto": None}, "batch 0 but the state has no auto part"),
    ]
    for change, message in cases:
        with pytest.raises(ValueError, match=message):
            policy_from_state(broken(change))

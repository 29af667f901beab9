"""ps.control.dynamic, the proportional policy: its decisions and invariants over random histories
(its convergence on simulated workers: test_dynamic_convergence.py)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ps.control.config import PolicyConfig
from ps.control.policy import build_policy, policy_from_state, reconfigured
from ps.control.worker_plan import WorkerPlan
from ps.control.proportional import outside_deadband, proportional_targets, total_preserving
from tests.simulated_workers import make_policy, speed_map, run_to_steady, water_level, snapshot

FAST = settings(max_examples=40, deadline=None)


# ---------------------------------------------------------------- adjust


@pytest.mark.parametrize("policy", ["uniform", "static"])
def test_open_loop_policies_do_not_adjust(policy: str) -> None:
    ctl = make_policy(cores=[1.0, 3.0], policy=policy)
    plan = ctl.replan()
    ctl.observe("w0", plan["w0"], 1.0)
    ctl.observe("w1", plan["w1"], 100.0)
    assert ctl.adjust() == plan
    assert ctl.adjustments == 0


def test_inside_deadband_nothing_changes() -> None:
    ctl = make_policy(2, deadband=0.1)
    ctl.replan()
    ctl.observe("w0", 64, 10.0)
    ctl.observe("w1", 64, 11.5)
    assert ctl.adjust() == {"w0": 64, "w1": 64}
    assert ctl.adjustments == 0
    assert ctl.smoothed_ms() == {"w0": 10.0, "w1": 11.5}


def test_only_movers_change_when_they_absorb_the_difference() -> None:
    ctl = make_policy(4, deadband=0.1)
    ctl.replan()
    inside = 2 * 32 - (25.6 + 32 * 32 / 24) / 2
    for k, t in {"w0": 25.6, "w1": 32 * 32 / 24, "w2": inside, "w3": inside}.items():
        ctl.observe(k, 32, t)
    assert ctl.adjust() == {"w0": 40, "w1": 24, "w2": 32, "w3": 32}
    assert ctl.adjustments == 1
    assert ctl.smoothed_ms()["w2"] == pytest.approx(inside)


def test_lone_mover_falls_back_to_fitting_everyone() -> None:
    ctl = make_policy(4, deadband=0.1)
    ctl.replan()
    ctl.observe("w0", 32, 40.0)
    for k in ("w1", "w2", "w3"):
        ctl.observe(k, 32, 88.0 / 3)
    plan = ctl.adjust()
    assert sum(plan.values()) == 128
    assert plan["w0"] == 25
    assert sorted(plan.values()) == [25, 34, 34, 35]


def test_unmeasured_workers_keep_their_batch() -> None:
    ctl = make_policy(3, global_batch=120)
    ctl.replan()
    ctl.observe("w0", 40, 10.0)
    ctl.observe("w1", 40, 30.0)
    plan = ctl.adjust()
    assert plan == {"w0": 60, "w1": 20, "w2": 40}


def test_adjust_respects_bounds() -> None:
    ctl = build_policy(PolicyConfig(policy="dynamic", global_batch=100, min_samples=1))
    ctl.add_worker("fast", max_batch=60)
    ctl.add_worker("slow", min_batch=30)
    ctl.replan()
    ctl.observe("fast", 50, 1.0)
    ctl.observe("slow", 50, 100.0)
    assert ctl.adjust() == {"fast": 60, "slow": 40}


def test_adjust_after_removal_restores_global_batch() -> None:
    ctl = make_policy(4)
    ctl.replan()
    for k in ("w0", "w1", "w2", "w3"):
        ctl.observe(k, 32, 10.0)
    ctl.remove_worker("w3")
    plan = ctl.adjust()
    assert sum(plan.values()) == 128
    assert sorted(plan.values()) == [42, 43, 43]


def test_asp_adjust_keeps_the_sum_at_b_within_the_bounds() -> None:
    ctl = build_policy(PolicyConfig(policy="dynamic", global_batch=64, keep_global_sum=False, max_batch=50, min_samples=1))
    for i in range(3):
        ctl.add_worker(f"w{i}")
    ctl.replan()
    for k, t in {"w0": 2.0, "w1": 8.0, "w2": 5.0}.items():
        ctl.observe(k, {"w0": 22, "w1": 21, "w2": 21}[k], t)
    assert ctl.adjust() == {"w0": 40, "w1": 9, "w2": 15}  # t_bar = 64 / sum(T), fitted to exactly 64
    assert ctl.adjustments == 1


def test_asp_adjust_rounds_and_clips_when_the_bounds_cannot_meet_b() -> None:
    ctl = build_policy(PolicyConfig(policy="dynamic", global_batch=64, keep_global_sum=False, max_batch=20, min_samples=1))
    for i in range(3):
        ctl.add_worker(f"w{i}")
    assert ctl.replan() == {"w0": 20, "w1": 20, "w2": 20}  # 60: the most the bounds allow
    for k, t in {"w0": 2.0, "w1": 8.0, "w2": 5.0}.items():
        ctl.observe(k, 20, t)
    assert ctl.adjust() == {"w0": 20, "w1": 9, "w2": 15}


def test_dynamic_replan_keeps_relative_throughputs() -> None:
    ctl = make_policy(3, global_batch=120)
    speeds = speed_map([1.0, 2.0, 3.0])
    ctl.replan()
    run_to_steady(ctl, speeds)
    assert ctl.plan() == {"w0": 20, "w1": 40, "w2": 60}
    ctl.remove_worker("w1")
    assert ctl.replan() == {"w0": 30, "w2": 90}
    ctl.add_worker("w9")
    assert ctl.replan() == {"w0": 20, "w2": 60, "w9": 40}


def test_dynamic_replan_estimates_newcomers_from_cores() -> None:
    ctl = make_policy(cores=[1.0, 1.0], global_batch=120, dynamic_start="static")
    ctl.replan()
    run_to_steady(ctl, speed_map([1.0, 3.0]))
    assert ctl.plan() == {"w0": 30, "w1": 90}
    ctl.add_worker("w2", cores=4.0)
    assert ctl.replan() == {"w0": 10, "w1": 30, "w2": 80}


def test_a_newcomer_declaring_a_million_cores_beside_a_denormal_one_gets_a_plan() -> None:
    """Declared cores are any positive float (a Join checks 0 < cores <= 1e6): the measured worker's
    share of them underflows to 0, and the replan falls back to the cores instead of dividing by it."""
    ctl = make_policy(cores=[5e-324], global_batch=24, dynamic_start="static")
    ctl.replan()
    run_to_steady(ctl, speed_map([1.0]))
    ctl.add_worker("w1", cores=1e6)
    plan = ctl.replan()
    assert sum(plan.values()) == 24 and plan["w1"] > plan["w0"] >= 1


# ---------------------------------------------------------------- property tests over random histories


@st.composite
def scenarios(draw: st.DrawFn, keep_global_sum: bool | None = None) -> WorkerPlan:
    """A planned policy with random config, workers and bounds (always feasible)."""
    ksum = draw(st.booleans()) if keep_global_sum is None else keep_global_sum
    n = draw(st.integers(1, 6))
    global_batch = draw(st.integers(8 * n, 512))
    config = PolicyConfig(
        policy=draw(st.sampled_from(["uniform", "static", "dynamic", "dynamic"])),
        global_batch=global_batch,
        deadband=draw(st.sampled_from([0.0, 0.05, 0.1, 0.3])),
        ewma_alpha=draw(st.sampled_from([0.3, 1.0])),
        keep_global_sum=ksum,
        dynamic_start=draw(st.sampled_from(["uniform", "static"])),
        min_samples=draw(st.sampled_from([1, 1, 3])),
    )
    ctl = build_policy(config)
    share = global_batch // n
    for i in range(n):
        lo = draw(st.none() | st.integers(1, min(4, share)))
        hi = draw(st.none() | st.integers(share + 1, 2 * global_batch))
        ctl.add_worker(f"w{i}", cores=draw(st.floats(0.5, 32.0)), min_batch=lo, max_batch=hi)
    ctl.replan()
    return ctl


def check_invariants(ctl: WorkerPlan, exact_sum: bool) -> None:
    """Bounds hold for every planned worker; if `exact_sum` the plan sums to B (ASP: where the bounds allow).

    `exact_sum` is False right after a removal: only `replan` (or a dynamic `adjust`) re-splits B.
    """
    state = ctl.state_dict()
    for w in state["workers"]:
        if w["batch"] is not None:
            assert w["min_batch"] <= w["batch"] <= w["max_batch"]
    reachable = sum(w["min_batch"] for w in state["workers"]) <= ctl.config.global_batch <= sum(
        w["max_batch"] for w in state["workers"])
    if exact_sum and (ctl.config.keep_global_sum or reachable) and ctl.plan():
        assert sum(ctl.plan().values()) == ctl.config.global_batch


def checked_adjust(ctl: WorkerPlan) -> None:
    """Run `adjust` and check the deadband and sum rules against the state it started from."""
    cfg = ctl.config
    before = ctl.plan()
    settled = {w["id"] for w in ctl.state_dict()["workers"] if w["samples"] >= cfg.min_samples}
    times = {k: t for k, t in ctl.smoothed_ms().items() if t is not None and t > 0 and k in settled}
    targets = proportional_targets({k: before[k] for k in times}, times) if times else {}
    if not cfg.keep_global_sum:
        targets = total_preserving(targets, before)
    movers = {k for k, t in targets.items() if outside_deadband(before[k], t, cfg.deadband)}
    count = ctl.adjustments
    after = ctl.adjust()
    changed = {k for k in after if after[k] != before[k]}
    assert ctl.adjustments == count + (1 if changed else 0)
    if cfg.policy != "dynamic":
        assert after == before
        return
    state = {w["id"]: w for w in ctl.state_dict()["workers"]}
    B = cfg.global_batch
    if not cfg.keep_global_sum and not sum(w["min_batch"] for w in state.values()) <= B <= sum(w["max_batch"] for w in state.values()):
        assert changed <= movers
        return
    assert sum(after.values()) == B
    if not movers and sum(before.values()) == B:
        assert not changed
    unmeasured = set(after) - set(targets)
    room = B - sum(before[k] for k in unmeasured)
    if targets and sum(state[k]["min_batch"] for k in targets) <= room <= sum(state[k]["max_batch"] for k in targets):
        assert all(after[k] == before[k] for k in unmeasured)
        if changed - movers:
            ideal = water_level(
                targets, room, {k: state[k]["min_batch"] for k in targets}, {k: state[k]["max_batch"] for k in targets}
            )
            assert all(abs(after[k] - ideal[k]) < 1.0 + 1e-6 for k in targets)


@FAST
@given(scenarios(), st.data())
def test_random_histories_keep_invariants(ctl: WorkerPlan, data: st.DataObject) -> None:
    check_invariants(ctl, exact_sum=True)
    next_id = 100
    stale = False
    for _ in range(data.draw(st.integers(1, 15))):
        op = data.draw(st.sampled_from(["observe", "observe", "observe", "adjust", "adjust", "remove", "join"]))
        ids = list(ctl.plan())
        if op == "observe" and ids:
            k = data.draw(st.sampled_from(ids))
            batch = data.draw(st.sampled_from([ctl.plan()[k], ctl.plan()[k], ctl.plan()[k] + 1]))
            ctl.observe(k, batch, data.draw(st.floats(0.01, 1e4)))
        elif op == "adjust":
            checked_adjust(ctl)
            stale = stale and ctl.config.policy != "dynamic"
            check_invariants(ctl, exact_sum=not stale)
        elif op == "remove" and len(ids) > 1:
            gone = data.draw(st.sampled_from(ids))
            ceiling = sum(w["max_batch"] for w in ctl.state_dict()["workers"] if w["id"] != gone)
            if ctl.config.keep_global_sum and ceiling < ctl.config.global_batch:
                continue
            ctl.remove_worker(gone)
            stale = True
            check_invariants(ctl, exact_sum=False)
        elif op == "join":
            try:
                ctl.add_worker(f"n{next_id}", cores=data.draw(st.floats(0.5, 32.0)))
            except ValueError:
                continue
            next_id += 1
            ctl.replan()
            stale = False
            check_invariants(ctl, exact_sum=True)
    state = ctl.state_dict()
    again = policy_from_state(json.loads(json.dumps(state)))
    assert again.state_dict() == state
    assert again.adjust() == ctl.adjust()
    assert again.state_dict() == ctl.state_dict()


@FAST
@given(scenarios(), st.data())
def test_rejected_input_changes_nothing(ctl: WorkerPlan, data: st.DataObject) -> None:
    ids = list(ctl.plan())
    k = data.draw(st.sampled_from(ids))
    ctl.observe(k, ctl.plan()[k], 3.0)
    before = snapshot(ctl)
    bad_calls: list[Callable[[], object]] = [
        lambda: ctl.observe("ghost", 8, 1.0),
        lambda: ctl.observe(k, data.draw(st.integers(-5, 0)), 1.0),
        lambda: ctl.observe(k, ctl.plan()[k], data.draw(st.sampled_from([math.nan, math.inf, -math.inf, -1e-9]))),
        lambda: ctl.add_worker(k),
        lambda: ctl.add_worker("fresh", cores=data.draw(st.sampled_from([0.0, -1.0, math.nan, math.inf]))),
        lambda: ctl.add_worker("fresh", min_batch=5, max_batch=4),
        lambda: ctl.remove_worker("ghost"),
    ]
    call = data.draw(st.sampled_from(bad_calls))
    with pytest.raises(ValueError):
        call()
    assert snapshot(ctl) == before


@FAST
@given(scenarios(keep_global_sum=False), st.lists(st.floats(0.01, 1e4), min_size=6, max_size=6), st.integers(1, 4))
def test_asp_holds_bounds_without_sum_rule(ctl: WorkerPlan, times: list[float], rounds: int) -> None:
    for _ in range(rounds):
        for (k, b), t in zip(ctl.plan().items(), times):
            ctl.observe(k, b, t * b)
        checked_adjust(ctl)
        check_invariants(ctl, exact_sum=False)


@FAST
@given(scenarios(), st.data())
def test_with_config_under_random_settings_keeps_invariants(ctl: WorkerPlan, data: st.DataObject) -> None:
    """Any new deadband, alpha, policy, start or bounds: the bounds and the sum rule hold, the count and the
    throughputs carry over, the plan stays if it still is one of the new settings; the same config copies."""
    for k, b in ctl.plan().items():
        ctl.observe(k, b, data.draw(st.floats(0.01, 1e4)))
    checked_adjust(ctl)
    assert json.dumps(reconfigured(ctl, ctl.config).state_dict(), sort_keys=True) == snapshot(ctl)
    old = ctl.config
    config = replace(
        old,
        policy=data.draw(st.sampled_from(["uniform", "static", "dynamic"])),
        deadband=data.draw(st.sampled_from([0.0, 0.05, 0.3])),
        ewma_alpha=data.draw(st.sampled_from([0.3, 1.0])),
        min_batch=data.draw(st.integers(1, 4)),
        max_batch=data.draw(st.none() | st.integers(old.global_batch // len(ctl.plan()) + 1, 2 * old.global_batch)),
        dynamic_start=data.draw(st.sampled_from(["uniform", "static"])),
    )
    resumed = reconfigured(ctl, config)
    assert resumed.config == config and resumed.adjustments == ctl.adjustments
    check_invariants(resumed, exact_sum=True)
    before = {w["id"]: w for w in ctl.state_dict()["workers"]}
    after = {w["id"]: w for w in resumed.state_dict()["workers"]}
    assert {k: w["throughput"] for k, w in after.items()} == {k: w["throughput"] for k, w in before.items()}
    if old.policy == config.policy == "dynamic" and all(w["min_batch"] <= before[k]["batch"] <= w["max_batch"]
                                                          for k, w in after.items()):
        assert resumed.plan() == ctl.plan() and resumed.smoothed_ms() == ctl.smoothed_ms()


def test_asp_total_does_not_drift_on_hl8_speeds() -> None:
    """Without a sum rule, Eq. 6's arithmetic-mean t_bar would inflate sum(b); ASP keeps it near B."""
    speeds = {"a": 6.0, "b": 6.0, "c": 4.0, "d": 32.0}
    ctl = build_policy(PolicyConfig(policy="dynamic", global_batch=128, keep_global_sum=False, min_samples=1))
    for name in speeds:
        ctl.add_worker(name)
    ctl.replan()
    for _ in range(30):
        for name, b in ctl.plan().items():
            ctl.observe(name, b, b / speeds[name])
        ctl.adjust()
    plan = ctl.plan()
    assert abs(sum(plan.values()) - 128) <= 0.1 * 128 + len(plan)
    times = [b / speeds[k] for k, b in plan.items()]
    assert max(times) / min(times) <= 1.25


def test_can_add_counts_every_workers_minimum_against_the_global_batch() -> None:
    """BSP (keep_global_sum): room for another worker only while every minimum still fits in B; ASP: always."""
    bsp = build_policy(PolicyConfig(policy="dynamic", global_batch=6, min_batch=2))
    assert bsp.can_add(3) and not bsp.can_add(4)
    bsp.add_worker("a", cores=1.0)
    bsp.add_worker("b", cores=1.0, min_batch=3)
    assert not bsp.can_add(1)  # 2 + 3 + 2 > 6
    bsp.remove_worker("b")
    assert bsp.can_add(2) and not bsp.can_add(3)
    asp = build_policy(PolicyConfig(policy="dynamic", global_batch=6, min_batch=2, keep_global_sum=False))
    assert asp.can_add(100)


# ---------------------------------------------------------------- at many workers


class Name(str):
    """A worker id that counts how often it is compared for equality (a list's membership test
    compares it with every element; a set's or a dict's only on a hash match)."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        Name.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_a_decision_that_moves_most_of_many_workers_compares_each_id_a_few_times() -> None:
    """2,000 workers of which most move: asking of every worker whether it is among the movers,
    a list, compared ids ~2 million times (seconds of a decision at 10,000 workers: n² in all)."""
    n = 2000
    ctl = build_policy(PolicyConfig(policy="dynamic", global_batch=32 * n, min_samples=1))
    names = [Name(f"w{i}") for i in range(n)]
    for k in names:
        ctl.add_worker(k)
    ctl.replan()
    for i, k in enumerate(names):
        ctl.observe(k, 32, 32.0 * (1.0 + i % 5))  # five speeds: all but a fifth are off the mean
    Name.compared = 0
    plan = ctl.adjust()
    assert sum(plan.values()) == 32 * n and ctl.adjustments == 1
    assert Name.compared <= 10 * n

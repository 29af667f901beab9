"""Tests for --adaptive-batch gns's pure core (ps.control.global_batch.goodput): the goodput choice of B, the
threshold, the bounds, the LR rules, its state; and B changed under every batch policy
(ps.control.policy.with_global_batch): Σb = B and each worker's bounds after every change."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ps.control.global_batch.goodput import (
    LR_SCALINGS,
    MAX_STEP,
    AdaptiveConfig,
    candidates,
    choose,
    goodput,
    lr_factor,
)
from ps.control.global_batch.decider import AdaptiveBatch
from ps.control.performance import measured_round, round_line
from ps.control.model.fitted_plan import vouched
from ps.control.model.time_fit import slope_measured
from ps.control.config import PolicyConfig
from ps.control.policy import build_policy, with_global_batch
from ps.control.registry import POLICIES
from common.params.aggregation import squared_norm
from common.transport.chunked import ChunkedVector

FAST = settings(max_examples=40, deadline=None)


def linear_round(per_sample_ms: float, overhead_ms: float):
    return lambda b: per_sample_ms * b + overhead_ms


def test_lr_rules_are_one_at_the_starting_batch_and_follow_their_formulas() -> None:
    for rule in LR_SCALINGS:
        assert lr_factor(rule, 256, 256, 100.0) == pytest.approx(1.0)
    assert lr_factor("linear", 512, 128, None) == pytest.approx(4.0)
    assert lr_factor("sqrt", 512, 128, None) == pytest.approx(2.0)
    # adascale: (B/B0)(phi+B0)/(phi+B); linear while noise dominates, flat once the signal does
    assert lr_factor("adascale", 512, 128, 1000.0) == pytest.approx(4 * 1128 / 1512)
    assert lr_factor("adascale", 512, 128, 1e9) == pytest.approx(4.0, rel=1e-5)
    assert lr_factor("adascale", 512, 128, 0.0) == pytest.approx(1.0)
    assert lr_factor("adascale", 512, 128, None) == 1.0  # phi unknown: the schedule as given
    with pytest.raises(ValueError):
        lr_factor("cubic", 512, 128, 1.0)


def test_the_choice_is_the_goodput_optimum_of_a_linear_round() -> None:
    # goodput = B/(qB + c) * (phi + B0)/(phi + B) peaks at B* = sqrt(c*phi/q)
    q, c, phi = 0.01, 40.0, 1000.0
    config = AdaptiveConfig(base_batch=128, min_batch=16, max_batch=16384, threshold=0.0)
    decision = choose(config, 1024, phi, 16, 16384, linear_round(q, c))  # within MAX_STEP of the optimum
    best = math.sqrt(c * phi / q)
    assert decision.changed and abs(math.log(decision.batch / best)) < math.log(16384 / 16) / 47
    assert decision.gain is not None and decision.gain > 0
    rate = decision.batch / linear_round(q, c)(decision.batch) * 1000
    assert decision.samples_per_s == pytest.approx(rate)
    assert decision.efficiency == pytest.approx((phi + 128) / (phi + decision.batch))
    # no candidate beats it by much
    top = max(goodput(b / linear_round(q, c)(b), phi, b, 128) for b in range(16, 16385, 7))
    assert goodput(decision.batch / linear_round(q, c)(decision.batch), phi, decision.batch, 128) >= 0.99 * top


def test_a_move_goes_at_most_max_step_and_the_next_decisions_go_on() -> None:
    q, c, phi = 0.01, 40.0, 1000.0  # the optimum at 2,000
    config = AdaptiveConfig(base_batch=128, min_batch=16, max_batch=16384, threshold=0.0)
    batch, path = 128, []
    for _ in range(6):
        decision = choose(config, batch, phi, 16, 16384, linear_round(q, c))
        assert batch <= MAX_STEP * decision.batch and decision.batch <= MAX_STEP * batch
        batch = decision.batch
        path.append(batch)
    assert path[0] == max(b for b in candidates(16, 16384, 128) if b <= MAX_STEP * 128)
    assert abs(math.log(batch / math.sqrt(c * phi / q))) < math.log(16384 / 16) / 47 and path[-1] == path[-2]
    # from above the same, downward; a B outside the bounds moves to the best inside at once
    assert choose(config, 16384, phi, 16, 16384, linear_round(q, c)).batch >= 16384 / MAX_STEP
    assert choose(config, 20000, phi, 16, 16384, linear_round(q, c)).batch == batch


def test_below_the_threshold_b_stays_and_at_zero_it_moves() -> None:
    q, c, phi = 0.01, 40.0, 1000.0
    near = 1800  # goodput within a few % of the optimum at ~2000
    moving = choose(AdaptiveConfig(near, 16, 16384, threshold=0.0), near, phi, 16, 16384, linear_round(q, c))
    assert moving.changed and 0 < moving.gain < 0.05
    held = choose(AdaptiveConfig(near, 16, 16384, threshold=0.05), near, phi, 16, 16384, linear_round(q, c))
    assert not held.changed and held.batch == near and held.reason == "gain below --adapt-threshold"


def test_on_a_guess_only_a_move_up_is_taken() -> None:
    # the guess counts all compute as per-sample: flat throughput, so efficiency alone says "smaller"
    guess = measured_round(256, {"a": 30.0}, 32.0).predict_global
    config = AdaptiveConfig(256, 64, 1024, threshold=0.05)
    assert choose(config, 256, 200.0, 64, 1024, guess).batch < 256
    held = choose(config, 256, 200.0, 64, 1024, guess, upward_only=True)
    assert not held.changed and held.batch == 256
    # where even the guess says "larger" (a round mostly fixed overhead), the move up is taken
    up = choose(config, 256, 5000.0, 64, 1024, measured_round(256, {"a": 2.0}, 40.0).predict_global, upward_only=True)
    assert up.changed and up.batch > 256
    # a B outside the bounds moves in whatever the basis
    assert choose(AdaptiveConfig(256, 64, 1024), 2048, 200.0, 64, 1024, guess, upward_only=True).batch <= 1024


def test_unknown_phi_or_round_time_changes_nothing() -> None:
    config = AdaptiveConfig(128, 16, 1024)
    assert not choose(config, 128, None, 16, 1024, linear_round(0.01, 1.0)).changed
    assert choose(config, 128, 50.0, 16, 1024, None).reason == "round time not measured yet"


def test_no_batch_left_between_the_flags_and_the_bounds_changes_nothing_and_says_both_bounds() -> None:
    """B held at 512 (min = max) on a training set whose epoch holds 16 rounds only up to 89."""
    decision = choose(AdaptiveConfig(512, 512, 512), 512, 50.0, 2, 89, linear_round(0.01, 1.0))
    assert not decision.changed and decision.batch == 512
    assert decision.reason == "no batch in [512, 512] is within the workers' bounds and leaves an epoch 16 rounds"


@FAST
@given(st.integers(1, 64), st.integers(1, 4096), st.integers(1, 4096), st.floats(0.0, 1e5),
       st.floats(1e-4, 1.0), st.floats(0.0, 500.0), st.integers(0, 10**6))
def test_b_stays_within_the_flags_and_the_workers_bounds(lo: int, span: int, workers_hi: int, phi: float,
                                                         q: float, c: float, seed: int) -> None:
    hi = lo + span
    base = random.Random(seed).randint(lo, hi)
    config = AdaptiveConfig(base, lo, hi, threshold=0.0)
    decision = choose(config, base, phi, 1, workers_hi, linear_round(q, c))
    if lo <= workers_hi:
        assert max(lo, 1) <= decision.batch <= min(hi, workers_hi) or decision.batch == base
        assert decision.changed or decision.batch == base
        if decision.changed:
            assert lo <= decision.batch <= min(hi, workers_hi)


def test_candidates_cover_both_ends_and_the_current_batch() -> None:
    points = candidates(16, 4096, 300)
    assert points[0] == 16 and points[-1] == 4096 and 300 in points and points == sorted(set(points))
    assert candidates(64, 64, 64) == [64]


def test_rounds_measured_at_two_batches_give_the_line_of_fixed_and_per_sample_cost() -> None:
    line = round_line({128: 30.0, 256: 34.0, 1024: 58.0})
    assert line is not None and line.predict_global(0) == pytest.approx(26.0) and line.predict_global(512) == pytest.approx(42.0)
    assert round_line({128: 30.0}) is None
    assert round_line({128: 30.0, 256: 29.0}) is None  # no line that grows with B: keep the other model
    # a fixed cost makes the larger B the better goodput where the per-sample guess saw none
    config = AdaptiveConfig(128, 32, 1024, threshold=0.0)
    assert choose(config, 128, 400.0, 32, 1024, line.predict_global).batch > 128


def test_measured_round_scales_compute_and_keeps_the_rest() -> None:
    model = measured_round(100, {"a": 10.0, "b": 20.0}, 25.0)
    assert model is not None
    assert model.predict_global(100) == pytest.approx(25.0) and model.predict_global(200) == pytest.approx(45.0)
    assert measured_round(100, {"a": 10.0, "b": None}, 25.0).predict_global(100) == pytest.approx(25.0)  # b: batch just changed
    assert measured_round(100, {"a": None}, 25.0) is None
    assert measured_round(100, {"a": 10.0}, None) is None


@pytest.mark.parametrize("kwargs, message", [
    ({"base_batch": 128, "min_batch": 300, "max_batch": 200}, "--min-global-batch 300 exceeds --max-global-batch 200"),
    ({"base_batch": 128, "min_batch": 0, "max_batch": 200}, "--min-global-batch"),
    ({"base_batch": 128, "min_batch": 16, "max_batch": -4}, "--max-global-batch"),
    ({"base_batch": 512, "min_batch": 16, "max_batch": 256}, "outside"),
    ({"base_batch": 128, "min_batch": 16, "max_batch": 256, "threshold": 1.0}, "--adapt-threshold"),
    ({"base_batch": 128, "min_batch": 16, "max_batch": 256, "threshold": -0.1}, "--adapt-threshold"),
    ({"base_batch": 128, "min_batch": 16, "max_batch": 256, "lr_scaling": "cubic"}, "--lr-scaling"),
])
def test_bad_settings_say_which_flag(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AdaptiveConfig(**kwargs)


def test_state_round_trips_through_json_and_refuses_another_start() -> None:
    a = AdaptiveBatch(AdaptiveConfig(128, 16, 4096, threshold=0.0))
    decision = a.choose(1000.0, 16, 4096, linear_round(0.01, 40.0))
    a.apply(decision)
    assert a.batch == decision.batch != 128 and a.changes == 1 and a.decisions == 1
    b = AdaptiveBatch(AdaptiveConfig(128, 16, 4096))
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert (b.batch, b.phi, b.decisions, b.changes) == (a.batch, a.phi, a.decisions, a.changes)
    assert b.lr_factor() == pytest.approx(a.lr_factor())
    with pytest.raises(ValueError, match="started at --global-batch 128"):
        AdaptiveBatch(AdaptiveConfig(256, 16, 4096)).load_state_dict(a.state_dict())
    with pytest.raises(ValueError):
        b.load_state_dict({**a.state_dict(), "batch": 0})


def test_a_state_whose_batch_is_outside_the_job_s_bounds_is_refused() -> None:
    """A checkpoint edited to B = 1 in a job of two workers resumed and hung: each worker was refused as
    the job full. Above --max-global-batch it trained at the file's B."""
    a = AdaptiveBatch(AdaptiveConfig(128, 16, 4096))
    for batch in (15, 4097):
        with pytest.raises(ValueError, match=f"adaptive batch B = {batch} is outside "
                                             r"\[--min-global-batch 16, --max-global-batch 4096\]"):
            a.load_state_dict({**a.state_dict(), "batch": batch})
        assert a.batch == 128  # nothing changed
    a.load_state_dict({**a.state_dict(), "batch": 4096})
    assert a.batch == 4096


@FAST
@given(st.sampled_from(tuple(POLICIES)), st.lists(st.floats(0.2, 5.0), min_size=1, max_size=6),
       st.lists(st.integers(4, 3000), min_size=1, max_size=12), st.integers(1, 3), st.integers(0, 10**6))
def test_every_change_of_b_keeps_the_exact_sum_and_the_bounds(policy: str, speeds: list[float], batches: list[int],
                                                               min_batch: int, seed: int) -> None:
    rnd = random.Random(seed)
    n = len(speeds)
    start = max(n * min_batch, 64)
    ctl = build_policy(PolicyConfig(policy=policy, global_batch=start, min_batch=min_batch))  # type: ignore[arg-type]
    for i in range(n):
        ctl.add_worker(f"w{i}", cores=speeds[i])
    ctl.replan()
    for target in batches:
        for _ in range(4):  # measurements, so the policies have something to move on
            for k, b in ctl.plan().items():
                if b:
                    ctl.observe(k, b, b / speeds[int(k[1:])] * (1 + 0.05 * rnd.random()) + 1.0)
            ctl.observe_round(10.0)
        ctl.adjust()
        target = max(target, n * min_batch)
        before = {k: w for k, w in ctl.plan().items()}
        ctl = with_global_batch(ctl, target)
        plan = ctl.plan()
        assert sum(plan.values()) == target == ctl.config.global_batch
        assert set(plan) == set(before)
        for w in ctl.state_dict()["workers"]:
            assert w["batch"] == 0 or w["min_batch"] <= w["batch"] <= w["max_batch"]
        lower, upper = ctl.global_batch_range()
        assert lower == n * min_batch and upper is None


def model_policy(costs: dict[str, tuple[float, float]]):
    """A model policy at B = 96 over workers `costs`, and a function that runs 200 rounds of them
    (time q·b + s each, a round overhead of 2 ms, decisions as due)."""
    ctl = build_policy(PolicyConfig(policy="model", global_batch=96))
    for k in costs:
        ctl.add_worker(k)
    ctl.replan()
    return ctl, lambda: fit(ctl, costs)


def fit(ctl, costs: dict[str, tuple[float, float]]) -> None:
    """200 rounds of workers whose time is q·b + s (`costs`), a round overhead of 2 ms, decisions as due."""
    for r in range(200):
        for k, b in ctl.plan().items():
            if b:
                ctl.observe(k, b, costs[k][0] * b + costs[k][1])
        ctl.observe_round(max(costs[k][0] * b + costs[k][1] for k, b in ctl.plan().items() if b) + 2.0)
        if ctl.decision_due() or r % 10 == 9:
            ctl.adjust()


def test_the_model_policy_predicts_rounds_at_other_batches_once_identified() -> None:
    ctl, run = model_policy({"a": (0.1, 5.0), "b": (0.3, 5.0)})
    assert ctl.predicted_round_ms(96) is None
    run()
    small, large = ctl.predicted_round_ms(96), ctl.predicted_round_ms(960)
    assert small is not None and large is not None
    # the optimum finishes both together: b_a = 3 b_b, T = 0.1 * 0.75 B + 5 (+ c = 2)
    assert large == pytest.approx(0.075 * 960 + 5 + 2, rel=0.05)
    assert small == pytest.approx(0.075 * 96 + 5 + 2, rel=0.1)


def test_the_model_policy_says_which_workers_a_batch_would_train() -> None:
    # b's fixed cost (30 ms) outweighs what it takes off a at a small B: the plan there parks it
    ctl, run = model_policy({"a": (0.1, 5.0), "b": (0.3, 30.0)})
    assert ctl.predicted_plan(96) is None  # nothing identified yet
    run()
    small, large = ctl.predicted_plan(16), ctl.predicted_plan(960)
    assert small is not None and large is not None
    assert sum(small.values()) == 16 and sum(large.values()) == 960
    assert small["b"] == 0 < small["a"] and large["b"] > 0 and large["a"] > 0
    assert ctl.predicted_round_ms(16) == pytest.approx(0.1 * 16 + 5 + 2, rel=0.1)


def test_a_law_whose_time_per_sample_is_not_measured_prices_no_larger_batch_at_its_fixed_cost() -> None:
    """b's times are 480 ms at every batch it ran (a few samples, then parked): its fitted line is flat and
    its time per sample not measured. A larger B is priced with b proportional above the batches it ran
    at (fitted_plan.vouched), not with b taking hundreds of samples for the same 480 ms: that priced B = 960
    at 482 ms, which a alone takes 965 for."""
    ctl, run = model_policy({"a": (1.0, 5.0), "b": (0.0, 480.0)})
    run()
    finish = ctl._held.finishes()["b"]  # type: ignore[attr-defined]
    assert not slope_measured(finish.line)
    plan, round_ms = ctl.predicted_plan(960), ctl.predicted_round_ms(960)
    assert plan is not None and round_ms is not None
    assert plan["b"] <= 2 * max(1.0, finish.line.centre) and round_ms > 0.95 * (960 + 5)
    assert ctl.predicted_round_ms(96) == pytest.approx(96 + 5 + 2, rel=0.01)  # b parked: a's own round
    time = vouched(finish)
    batches = [1, 2, 3, 4, 8, 64, 960]
    assert [time(b) for b in batches] == sorted(time(b) for b in batches)
    assert all(time(b) == finish.at(b) for b in batches if b <= finish.line.centre)
    measured = ctl._held.finishes()["a"]  # type: ignore[attr-defined]
    assert slope_measured(measured.line) and vouched(measured) == measured.at


def test_squared_norms_are_summed_in_float64_part_by_part() -> None:
    torch.manual_seed(0)
    values = torch.randn(10_000) * 1e-3 + 1.0
    chunked = ChunkedVector([values[:3000], values[3000:]])
    exact = float(values.double().pow(2).sum())
    assert squared_norm(values) == pytest.approx(exact, rel=1e-12)
    assert squared_norm(chunked) == pytest.approx(exact, rel=1e-12)
    half = values.to(torch.bfloat16)
    assert squared_norm(half) == pytest.approx(float(half.double().pow(2).sum()), rel=1e-12)


def test_an_adaptive_run_gets_a_plot_of_b_phi_efficiency_lr_and_accuracy(tmp_path) -> None:
    """Pure: write_plots adds adaptive_batch.png when the log has adapt records."""
    from deploy.plots import ADAPTIVE_PANELS, plot_adaptive_batch, write_plots

    events = [{"event": "adapt", "elapsed_s": 1.0 + e, "global_batch": 64 * 2 ** min(e, 2), "phi": 300.0 + 10 * e,
               "efficiency": 0.9, "lr": 0.1 * (1 + e)} for e in range(4)]
    events[0]["phi"] = None
    events += [{"event": "eval", "elapsed_s": 1.5 + e, "wall_s": 1.0 + e, "epoch": e + 1, "accuracy": 0.3 + 0.1 * e}
               for e in range(3)]
    paths = write_plots(events, tmp_path)
    assert paths[-1].name == "adaptive_batch.png" and paths[-1].stat().st_size > 0
    fig = plot_adaptive_batch(events)
    assert [ax.get_ylabel() for ax in fig.axes] == [label for _, label in ADAPTIVE_PANELS]
    b_line, phi_line = fig.axes[0].lines
    assert list(b_line.get_ydata()) == [64, 128, 256, 256] and len(phi_line.get_ydata()) == 3
    assert write_plots(events[4:], tmp_path)[-1].name == "accuracy.png"

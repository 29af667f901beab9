"""The adaptive batch's measuring steps (ps/control/global_batch/goodput.py): the epoch's bound on a
candidate B, the probe of a second B, and the take-back of a move the measured rounds contradict."""

from __future__ import annotations

import pytest

from ps.control.global_batch.decider import TAKE_BACK_MEMORY, AdaptiveBatch
from ps.control.global_batch.goodput import (DECIDE_EVERY, GAIN_SDS, MAX_STEP, MIN_STEPS_PER_EPOCH, STUCK, UNMEASURABLE,
                                             AdaptiveConfig, Decision,
                                             candidates, choose, contradicted, epoch_bound, measured_goodput, moved,
                                             probe_batch)
from ps.control.performance import round_line

CONFIG = AdaptiveConfig(base_batch=128, min_batch=64, max_batch=1024, threshold=0.05)


def test_an_epoch_bounds_b_to_its_minimum_steps() -> None:
    assert MIN_STEPS_PER_EPOCH == 2 * DECIDE_EVERY  # two decisions an epoch at the default --adapt-every
    assert epoch_bound(1024, 1438) == 1438 // MIN_STEPS_PER_EPOCH == 89  # digits: never 1024 (1.4 steps)
    assert epoch_bound(1024, 65536) == 1024  # a large set leaves the flag's bound
    assert epoch_bound(1024, 1438, min_steps=2) == 719
    assert epoch_bound(1024, 3) == 1  # never below one sample


def test_a_choice_within_the_epoch_bound_never_passes_it() -> None:
    # a round of fixed cost only: goodput grows with B (phi large), the scan goes to the top of the range
    decision = choose(CONFIG, 64, 1e6, 64, epoch_bound(1024, 1438), lambda b: 100.0)
    assert decision.changed and decision.batch == epoch_bound(1024, 1438) == 89


@pytest.mark.parametrize(("current", "lower", "upper", "probe"), [
    (128, 64, 1024, 256),  # twice B
    (128, 64, 179, 179),  # twice B clamped to the top
    (179, 64, 179, 89),  # at the top: half B
    (64, 64, 64, None),  # the bounds hold B alone
    (100, 64, 100, 64),  # half B clamped to the bottom
])
def test_the_probe_is_a_second_batch_within_the_bounds(current: int, lower: int, upper: int, probe: int | None) -> None:
    assert probe_batch(current, lower, upper) == probe


def test_the_probe_goes_where_the_guess_predicts_the_better_goodput() -> None:
    # the guess: the slowest worker's 2 ms/sample scales with B, 30 ms of the round stays
    def guess(b: int) -> float:
        return 30.0 + 2.0 * b

    # phi far below B: the efficiency a larger B loses outweighs its throughput; probe down
    assert probe_batch(256, 32, 1024, 20.0, guess, 256) == 128
    # phi far above B: a larger B keeps its efficiency and amortises the fixed 30 ms; probe up
    assert probe_batch(32, 8, 1024, 5000.0, guess, 32) == 64
    # only where the noise scale stays measurable
    assert probe_batch(256, 32, 1024, 20.0, guess, 256, measurable=lambda b: b > 200) == 512
    assert probe_batch(256, 32, 1024, 20.0, guess, 256, measurable=lambda b: False) is None
    # phi unknown, or no guess: twice B
    assert probe_batch(256, 32, 1024, None, guess, 256) == 512
    assert probe_batch(256, 32, 1024, 20.0, None, 256) == 512


def test_a_probe_and_the_line_through_both_batches_choose_by_measured_rounds() -> None:
    # measured: 40 ms fixed + 0.1 ms/sample; phi large (efficiency ~1): the larger B is worth more
    rounds = {128: 40 + 12.8, 179: 40 + 17.9}
    line = round_line(rounds)
    assert line is not None and line.fixed == pytest.approx(40) and line.slope == pytest.approx(0.1)
    decision = choose(CONFIG, 128, 1e6, 64, 179, line.predict_global)
    assert decision.changed and decision.batch == 179 and decision.reason == "goodput"
    # phi small: a sample at a larger B is worth less; the smallest B wins, reached MAX_STEP at a time
    assert choose(CONFIG, 179, 5.0, 64, 179, line.predict_global).batch == min(
        b for b in candidates(64, 179, 179) if MAX_STEP * b >= 179)


def test_a_move_whose_measured_goodput_fell_is_contradicted() -> None:
    rounds = {128: 50.0, 179: 100.0}  # 179 samples took twice as long as 128: fewer samples per second
    assert contradicted(128, 179, rounds, 1e6, 128)
    assert not contradicted(179, 128, rounds, 1e6, 128)  # the move down gained
    assert not contradicted(128, 256, rounds, 1e6, 128)  # 256 not measured yet
    assert not contradicted(128, 179, rounds, None, 128)  # phi unknown
    # efficiency counts: at phi=10 a sample at 179 is worth (10+128)/(10+179) of one at 128
    rounds = {128: 50.0, 179: 60.0}
    assert measured_goodput(179, 60.0, 10.0, 128) < measured_goodput(128, 50.0, 10.0, 128)
    assert contradicted(128, 179, rounds, 10.0, 128) and not contradicted(128, 179, rounds, 1e6, 128)


def test_a_probe_or_take_back_is_a_counted_decision_with_its_reason() -> None:
    decider = AdaptiveBatch(CONFIG)
    decision = decider.note(moved(CONFIG, 128, 179, 300.0, "probe: a second batch for the round line", lambda b: 10.0))
    assert decision.changed and decision.batch == 179 and decision.samples_per_s == pytest.approx(17900)
    assert decision.efficiency == pytest.approx((300 + 128) / (300 + 179))
    decider.apply(decision)
    assert decider.batch == 179 and decider.decisions == 1 and decider.changes == 1 and decider.phi == 300.0
    stay = decider.note(moved(CONFIG, 179, 179, None, "measuring the batch moved to"))
    assert not stay.changed and decider.phi == 300.0 and decider.decisions == 2


def test_a_gain_within_the_noise_scales_uncertainty_is_no_move() -> None:
    # a round of fixed cost only, φ = 1000: B = 256 gains about 1.6x, but φ may be far from 1000
    sure = choose(CONFIG, 128, 1000.0, 64, 256, lambda b: 100.0)
    assert sure.changed and sure.batch == 256 and sure.gain_sd == 0.0
    unsure = choose(CONFIG, 128, 1000.0, 64, 256, lambda b: 100.0, phi_sd=50_000.0)
    assert not unsure.changed and unsure.reason == "gain within the noise scale's uncertainty"
    assert unsure.gain is not None and unsure.gain_sd is not None and unsure.gain_sd >= unsure.gain > CONFIG.threshold
    assert choose(CONFIG, 128, 1000.0, 64, 256, lambda b: 100.0, phi_sd=10.0).changed
    assert "gain_sd" in unsure.record()
    # beyond one standard error's spread but within GAIN_SDS of them: no move either
    near = choose(CONFIG, 128, 1000.0, 64, 256, lambda b: 100.0, phi_sd=892.0)
    assert near.gain is not None and near.gain_sd is not None
    assert not near.changed and near.gain_sd < near.gain <= GAIN_SDS * near.gain_sd


def test_the_move_under_review_and_the_closed_directions_are_in_the_checkpoint() -> None:
    ab = AdaptiveBatch(CONFIG)
    ab.apply(Decision(256, 128, True, 0.2, 500.0, None, None, "goodput"))
    ab.closed = {"down": [64, 3]}
    state = ab.state_dict()
    assert state["format"] == "adaptive-batch/2" and state["previous"] == 128
    restored = AdaptiveBatch(CONFIG)
    restored.load_state_dict(state)
    assert (restored.batch, restored.previous, restored.closed) == (256, 128, {"down": [64, 3]})
    old = {k: v for k, v in state.items() if k not in ("previous", "closed")}
    restored.load_state_dict({**old, "format": "adaptive-batch/1"})
    assert (restored.batch, restored.previous, restored.closed) == (256, None, {})
    bads: list[object] = [{"sideways": [64, 3]}, {"up": [64]}, {"up": [64, 0]}, []]
    for bad in bads:
        with pytest.raises(ValueError, match="closed"):
            AdaptiveBatch(CONFIG).load_state_dict({**state, "closed": bad})
    with pytest.raises(ValueError, match="adaptive-batch/2"):
        AdaptiveBatch(CONFIG).load_state_dict({**state, "format": "adaptive-batch/0"})


def test_a_move_goes_only_where_the_noise_scale_stays_measurable() -> None:
    # φ small: goodput is best at a small B (32); below 100 the plan would train one worker alone, where
    # the noise scale cannot be measured (one batch size per round), so the move stops at 100
    config = AdaptiveConfig(base_batch=512, min_batch=16, max_batch=1024, threshold=0.05)
    round_ms = lambda b: 0.2 * b + 20.0  # noqa: E731
    free = choose(config, 128, 10.0, 16, 1024, round_ms)
    assert free.changed and free.batch == min(b for b in candidates(16, 1024, 128) if MAX_STEP * b >= 128)
    kept = choose(config, 128, 10.0, 16, 1024, round_ms, measurable=lambda b: b >= 100)
    assert kept.changed and kept.batch == min(b for b in candidates(16, 1024, 128) if b >= 100)
    # where no other batch is measurable, B stays, and says why (before: "the current batch is best",
    # while φ stayed at its last measured value); a B outside the bounds still moves in
    stuck = choose(config, 512, 10.0, 16, 1024, round_ms, measurable=lambda b: False)
    assert not stuck.changed and stuck.reason == STUCK
    # at a B where it cannot be measured (after the policy parked all but one worker there), B moves
    # to the best measurable batch even where that loses goodput: φ would stay frozen otherwise
    at_32 = choose(config, 32, 10.0, 16, 1024, round_ms, measurable=lambda b: b >= 100)
    assert at_32.changed and at_32.batch == min(b for b in candidates(16, 1024, 32) if b >= 100)
    assert at_32.gain is not None and at_32.gain < 0 and at_32.reason == UNMEASURABLE


def test_a_move_away_from_an_unmeasurable_batch_closes_the_way_back() -> None:
    config = AdaptiveConfig(base_batch=32, min_batch=16, max_batch=1024, threshold=0.05)
    round_ms = lambda b: 0.2 * b + 20.0  # noqa: E731  (φ small: goodput is best at small B)
    ab = AdaptiveBatch(config)
    away = ab.choose(10.0, 16, 1024, round_ms, measurable=lambda b: b >= 100)
    assert away.changed and away.reason == UNMEASURABLE and away.batch >= 100
    ab.apply(away)
    assert ab.previous is None  # not a goodput move: nothing to review
    # the next decisions predict the small B measurable again; B does not go back below the move
    for _ in range(TAKE_BACK_MEMORY):
        assert ab.bounds(16, 1024) == (away.batch, 1024)
        assert not ab.choose(10.0, 16, 1024, round_ms, measurable=lambda b: True).changed
    assert ab.bounds(16, 1024) == (16, 1024)
    back = ab.choose(10.0, 16, 1024, round_ms, measurable=lambda b: True)
    assert back.changed and back.batch < away.batch
    outside = choose(config, 2048, 10.0, 16, 1024, round_ms, measurable=lambda b: False)
    assert outside.changed and outside.batch <= 1024


"""The review of a move of B once the rounds at its new batch are measured (ps/control/global_batch/
decider.py, `AdaptiveBatch.review`): a probe stays only on a measured gain, and a B where the noise
scale cannot be measured is left upward even while the noise scale is unknown."""

from __future__ import annotations

import pytest

from ps.control.global_batch.decider import PROBE_BACK, REOPEN_FACTOR, TAKE_BACK_MEMORY, AdaptiveBatch
from ps.control.global_batch.goodput import (ESCAPE_STEP, PROBE, UNMEASURABLE, AdaptiveConfig, candidates, choose,
                                             measured_goodput, moved)

CONFIG = AdaptiveConfig(base_batch=64, min_batch=16, max_batch=512, threshold=0.05)
PHI = 300.0


def probed_to(batch: int) -> AdaptiveBatch:
    """An AdaptiveBatch at B₀ = 64 that has just probed `batch`."""
    ab = AdaptiveBatch(CONFIG)
    ab.apply(ab.note(moved(CONFIG, 64, batch, PHI, PROBE)))
    assert ab.batch == batch and ab.previous == 64 and ab.probing
    return ab


def test_a_probe_that_measured_no_more_goodput_is_taken_back_and_its_direction_closed() -> None:
    ab = probed_to(32)
    # not measured at 32 yet: wait there
    wait = ab.review(PHI, {64: 100.0}, {})
    assert wait is not None and not wait.changed and ab.previous == 64
    # 32 samples in 70 ms against 64 in 100: fewer samples a second, the efficiency gained at φ = 300
    # does not make up for it
    rounds = {64: 100.0, 32: 70.0}
    assert measured_goodput(32, 70.0, PHI, 64) < measured_goodput(64, 100.0, PHI, 64)
    back = ab.review(PHI, rounds, {64: 0.0, 32: 0.0})
    assert back is not None and back.changed and back.batch == 64 and back.reason == PROBE_BACK
    ab.apply(back)
    assert ab.batch == 64 and ab.previous is None and not ab.probing
    assert ab.closed == {"down": [64, TAKE_BACK_MEMORY]}


def test_a_probe_within_the_rounds_noise_is_taken_back_where_a_goodput_move_would_stand() -> None:
    # 128 samples in 199 ms against 64 in 100 at φ = 1e9: goodput 0.5% higher at 128, within 2% noise
    rounds, noise = {64: 100.0, 128: 201.0}, {64: 0.02, 128: 0.02}
    assert measured_goodput(128, 201.0, 1e9, 64) < measured_goodput(64, 100.0, 1e9, 64)
    goodput_move = AdaptiveBatch(CONFIG)
    goodput_move.apply(moved(CONFIG, 64, 128, 1e9, "goodput"))
    assert goodput_move.review(1e9, rounds, noise) is None  # a loss within the noise: it stands
    back = probed_to(128).review(1e9, rounds, noise)
    assert back is not None and back.batch == 64 and back.reason == PROBE_BACK


def test_a_probe_that_measured_more_goodput_stays() -> None:
    ab = probed_to(128)
    assert ab.review(1e9, {64: 100.0, 128: 150.0}, {}) is None  # 853 samples/s against 640
    assert ab.batch == 128 and ab.previous is None and not ab.probing and ab.closed == {}


def test_the_probe_under_review_is_in_the_checkpoint() -> None:
    state = probed_to(32).state_dict()
    assert state["probing"] is True and state["previous"] == 64
    restored = AdaptiveBatch(CONFIG)
    restored.load_state_dict(state)
    assert (restored.batch, restored.previous, restored.probing) == (32, 64, True)
    restored.load_state_dict({k: v for k, v in state.items() if k != "probing"})  # reviewed as a goodput move
    assert (restored.previous, restored.probing) == (64, False)
    with pytest.raises(ValueError, match="probing"):
        restored.load_state_dict({**state, "probing": "yes"})


def test_an_unmeasurable_batch_is_left_upward_while_the_noise_scale_is_unknown() -> None:
    """One worker at one batch adds no estimate (gns.py): with φ unknown and the plan training one
    worker, B would stay there for good."""
    measurable = lambda b: b >= 100  # noqa: E731  (below 100 the plan trains one worker)
    escape = choose(CONFIG, 20, None, 16, 512, lambda b: 10.0 + b, measurable=measurable)
    assert escape.changed and escape.reason == UNMEASURABLE
    assert escape.batch == min(b for b in candidates(16, 512, 20) if b >= 100)
    # at least ESCAPE_STEP times up, where a batch that far is measurable; else the nearest above
    anywhere = choose(CONFIG, 100, None, 16, 512, None, measurable=lambda b: b != 100)
    assert anywhere.batch == min(b for b in candidates(16, 512, 100) if b >= ESCAPE_STEP * 100)
    near = choose(CONFIG, 100, None, 16, 512, None, measurable=lambda b: 100 < b < 110)
    assert near.changed and 100 < near.batch < 110
    # the same without a round time yet
    assert choose(CONFIG, 20, None, 16, 512, None, measurable=measurable).batch == escape.batch
    # measurable at B now, or nothing above it is: unchanged
    assert not choose(CONFIG, 120, None, 16, 512, None, measurable=measurable).changed
    assert not choose(CONFIG, 20, None, 16, 512, None, measurable=lambda b: False).changed
    assert not choose(CONFIG, 20, None, 16, 512, None).changed


def test_an_unmeasurable_batch_is_left_upward_where_a_smaller_one_is_predicted_measurable() -> None:
    """A smaller B gives fewer workers a share: the policy's prediction that one is measurable after
    the plan at B now trained one worker is not taken."""
    round_ms = lambda b: 0.2 * b + 20.0  # noqa: E731  (φ small: goodput is best at a small B)
    measurable = lambda b: b != 20  # noqa: E731
    decision = choose(CONFIG, 20, 10.0, 16, 512, round_ms, measurable=measurable)
    assert decision.changed and decision.reason == UNMEASURABLE and decision.batch >= ESCAPE_STEP * 20
    # with nothing measurable above, the best below
    below = choose(CONFIG, 20, 10.0, 16, 512, round_ms, measurable=lambda b: b < 20)
    assert below.changed and below.batch < 20


@pytest.mark.parametrize("round_ms", [None, lambda b: 5.0 + 0.01 * b], ids=["no round time", "round time"])
def test_an_unmeasurable_batch_at_the_top_moves_down_no_further_than_half(round_ms: object) -> None:
    """At the top of the range with nothing measurable above, B goes to the nearest measurable batch
    below it within MAX_STEP, or stays (a move from an unmeasurable B needs no gain: the teacher's B on
    HL8 went 512 → 4, the smallest batch predicted to train two workers, and ran at 1/100 of the rate)."""
    near = choose(CONFIG, 512, PHI, 16, 512, round_ms, measurable=lambda b: b <= 16 or 300 <= b <= 400)
    assert near.changed and near.reason == UNMEASURABLE and near.batch == max(
        b for b in candidates(16, 512, 512) if 300 <= b <= 400), near
    far = choose(CONFIG, 512, PHI, 16, 512, round_ms, measurable=lambda b: b <= 16)
    assert not far.changed and far.batch == 512, far
    unknown = choose(CONFIG, 512, None, 16, 512, round_ms, measurable=lambda b: b <= 16 or 300 <= b <= 400)
    assert unknown.changed and unknown.batch == near.batch


def taken_back_down() -> AdaptiveBatch:
    """An AdaptiveBatch whose probe down to 32 was taken back at φ = PHI (fewer samples a second)."""
    ab = probed_to(32)
    back = ab.review(PHI, {64: 100.0, 32: 70.0}, {64: 0.0, 32: 0.0})
    assert back is not None
    ab.apply(back)
    return ab


def test_a_direction_closed_at_one_noise_scale_opens_once_it_has_halved_or_doubled() -> None:
    """A probe down taken back at φ = 300 is judged at that φ: where φ falls to half of it the smaller
    batch is worth more a sample than the take-back counted, and the way down opens again."""
    ab = taken_back_down()
    assert ab.closed == {"down": [64, TAKE_BACK_MEMORY]} and ab.closed_phi == {"down": PHI}
    assert ab.bounds(16, 512, PHI * 0.6) == (64, 512)  # within REOPEN_FACTOR: still closed
    assert ab.bounds(16, 512, PHI * 1.9) == (64, 512)
    assert ab.bounds(16, 512) == (64, 512)  # φ unknown: as it was
    assert ab.bounds(16, 512, PHI / REOPEN_FACTOR * 0.99) == (16, 512)
    assert ab.closed == {} and ab.closed_phi == {}
    # a direction closed where φ could not be measured opens by count alone
    ab.apply(moved(CONFIG, 64, 128, PHI, UNMEASURABLE))
    assert ab.closed == {"down": [128, TAKE_BACK_MEMORY]} and ab.closed_phi == {}
    assert ab.bounds(16, 512, PHI / 100) == (128, 512)


def test_the_noise_scale_a_direction_was_closed_at_is_in_the_checkpoint() -> None:
    ab = taken_back_down()
    state = ab.state_dict()
    assert state["closed_phi"] == {"down": PHI}
    restored = AdaptiveBatch(CONFIG)
    restored.load_state_dict(state)
    assert restored.closed == ab.closed and restored.closed_phi == {"down": PHI}
    restored.load_state_dict({k: v for k, v in state.items() if k != "closed_phi"})  # written without it
    assert restored.closed == ab.closed and restored.closed_phi == {}
    for bad in ({"up": PHI}, {"down": -1.0}, {"down": "x"}, [PHI]):
        with pytest.raises(ValueError, match="closed_phi"):
            AdaptiveBatch(CONFIG).load_state_dict({**state, "closed_phi": bad})

"""Tests for ps.control.global_batch.gns: the estimator's checkpoint state (state_dict, from_state_dict)."""

from __future__ import annotations

import json

import pytest

from ps.control.global_batch.gns import NoiseScaleEstimator
from tests.simulated_gradients import HL8_BATCHES, Gradients, feed, norms, round_with


def test_state_survives_json_and_continues_identically() -> None:
    grads = Gradients(seed=2, noise_scale=30.0)
    local, overall = norms(HL8_BATCHES, grads.worker_means(HL8_BATCHES, rounds=40))
    est = NoiseScaleEstimator(smoothing=0.9)
    feed(est, HL8_BATCHES, local[:20], overall[:20])
    est.observe([64], [float(overall[20])], float(overall[20]))
    restored = NoiseScaleEstimator.from_state_dict(json.loads(json.dumps(est.state_dict())))
    assert restored.estimate() == est.estimate() and restored.state_dict() == est.state_dict()
    for e in (est, restored):
        e.observe([128], [float(overall[21])], float(overall[21]))  # pairs with the remembered round
        feed(e, HL8_BATCHES, local[22:], overall[22:])
    assert restored.estimate() == est.estimate()


def good_state() -> dict:
    est = NoiseScaleEstimator(smoothing=0.9)
    est.observe(*round_with(1.0, 2.0))
    est.observe([64], [2.0], 2.0)
    return est.state_dict()


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"format": "gns/0"}, "unsupported GNS state format"),
        ({"smoothing": 1.5}, "smoothing must be in"),
        ({"rounds": -1}, "rounds must be >= 0"),
        ({"rounds": 1.5}, "rounds must be a whole number"),
        ({"signal_sum": float("nan")}, "signal_sum must be a finite number"),
        ({"noise_sum": "3"}, "noise_sum must be a finite number"),
        ({"rounds": 0}, "sums but no rounds"),
        ({"previous_single": [64]}, "previous_single must be null or [batch, squared norm]"),
        ({"previous_single": [0, 1.0]}, "previous batch must be >= 1"),
        ({"previous_single": [64, -1.0]}, "previous squared norm must be in [0, inf]"),
    ],
)
def test_bad_states_are_refused(change: dict, needle: str) -> None:
    with pytest.raises(ValueError) as caught:
        NoiseScaleEstimator.from_state_dict({**good_state(), **change})
    assert needle in str(caught.value)


def test_states_with_missing_or_extra_keys_are_refused() -> None:
    state = good_state()
    with pytest.raises(ValueError, match="exactly the keys"):
        NoiseScaleEstimator.from_state_dict({k: v for k, v in state.items() if k != "rounds"})
    with pytest.raises(ValueError, match="exactly the keys"):
        NoiseScaleEstimator.from_state_dict({**state, "weight": 1.0})
    with pytest.raises(ValueError, match="must be a mapping"):
        NoiseScaleEstimator.from_state_dict([])  # type: ignore[arg-type]

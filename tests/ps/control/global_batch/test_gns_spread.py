"""The noise scale's uncertainty (ps.control.global_batch.gns: NoiseScale.phi_sd from the rounds'
spread) and the checkpoint formats that carry it; pure, on simulated round estimates."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ps.control.global_batch.gns import STATE_FORMAT, NoiseScaleEstimator, RoundEstimate


def estimator(rng: np.random.Generator, rounds: int, smoothing: float = 0.95) -> NoiseScaleEstimator:
    est = NoiseScaleEstimator(smoothing)
    for _ in range(rounds):
        est._add(RoundEstimate(signal=1.0 + rng.normal(0.0, 0.5), noise=100.0 + rng.normal(0.0, 30.0)))
    return est


def test_the_standard_error_of_phi_matches_its_spread_over_repeated_runs() -> None:
    rng = np.random.default_rng(0)
    runs = [estimator(rng, 200).estimate() for _ in range(200)]
    spread = float(np.std([r.phi or 0.0 for r in runs]))
    claimed = float(np.mean([r.phi_sd or 0.0 for r in runs]))
    assert claimed == pytest.approx(spread, rel=0.25)


def test_one_round_has_no_spread_and_more_rounds_narrow_it() -> None:
    rng = np.random.default_rng(1)
    assert estimator(rng, 1).estimate().phi_sd is None
    assert NoiseScaleEstimator(0.0).estimate().phi_sd is None
    few, many = estimator(rng, 5).estimate().phi_sd, estimator(rng, 400, smoothing=0.99).estimate().phi_sd
    assert few is not None and many is not None and many < few


def test_the_spread_round_trips_and_an_older_state_loads_without_one() -> None:
    est = estimator(np.random.default_rng(2), 50)
    state = json.loads(json.dumps(est.state_dict()))
    assert state["format"] == STATE_FORMAT == "gns/2"
    assert NoiseScaleEstimator.from_state_dict(state).estimate() == est.estimate()
    old = {k: v for k, v in state.items() if k not in ("noise_sq_sum", "signal_sq_sum", "cross_sum")}
    loaded = NoiseScaleEstimator.from_state_dict({**old, "format": "gns/1"})
    assert loaded.estimate().phi == pytest.approx(est.estimate().phi)
    assert loaded.estimate().phi_sd == 0.0  # its rounds read back at their means; later rounds add the spread
    loaded._add(RoundEstimate(signal=0.5, noise=150.0))
    assert (loaded.estimate().phi_sd or 0.0) > 0.0
    with pytest.raises(ValueError, match="exactly the keys"):
        NoiseScaleEstimator.from_state_dict({**old, "format": "gns/2"})

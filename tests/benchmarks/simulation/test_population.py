"""benchmarks.simulation.population: workers drawn from a speed law, their step times and speed changes."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.simulation.population import DeviceClass, Population, SpeedLaw, parse_classes


def test_lognormal_speeds_spread_by_sigma_around_the_median() -> None:
    pop = Population(SpeedLaw(q_ms=0.5, s_ms=10.0, sigma=0.5), np.random.default_rng(0))
    pop.add(20_000)
    assert np.median(pop.q) == pytest.approx(0.5, rel=0.03)
    assert np.std(np.log(pop.q)) == pytest.approx(0.5, rel=0.03)
    assert (pop.s == 10.0).all()


def test_device_classes_by_weight() -> None:
    law = SpeedLaw(classes=parse_classes("gpu:0.1:5:3,cpu:1:20"))
    assert law.classes == (DeviceClass("gpu", 0.1, 5.0, 3.0), DeviceClass("cpu", 1.0, 20.0, 1.0))
    pop = Population(law, np.random.default_rng(0))
    pop.add(8000)
    assert np.mean(pop.q == 0.1) == pytest.approx(0.75, abs=0.02)
    assert set(zip(pop.q.tolist(), pop.s.tolist())) == {(0.1, 5.0), (1.0, 20.0)}


def test_weights_near_the_largest_float_draw_by_their_ratio() -> None:
    """Two weights of 1e308 summed to inf, and numpy refused the probabilities (nan)."""
    pop = Population(SpeedLaw(classes=parse_classes("gpu:0.1:5:1e308,cpu:1:20:1e308")), np.random.default_rng(0))
    pop.add(4000)
    assert np.mean(pop.q == 0.1) == pytest.approx(0.5, abs=0.03)


def test_steps_carry_noise_and_a_speed_change_scales_both_costs() -> None:
    pop = Population(SpeedLaw(q_ms=1.0, s_ms=4.0, sigma=0.0, noise=0.0), np.random.default_rng(0))
    names = pop.add(3)
    idx = np.arange(3)
    assert pop.step_ms(idx, np.array([10.0, 10.0, 10.0])).tolist() == [14.0, 14.0, 14.0]
    pop.scale({names[1]: 2.0})
    assert pop.expected_ms(idx, np.array([10.0, 10.0, 10.0])).tolist() == [14.0, 28.0, 14.0]
    pop.remove([names[0]])
    assert pop.living() == names[1:]
    noisy = Population(SpeedLaw(q_ms=1.0, s_ms=0.0, sigma=0.0, noise=0.1), np.random.default_rng(0))
    noisy.add(1)
    times = noisy.step_ms(np.zeros(5000, dtype=int), np.full(5000, 10.0))
    assert np.std(np.log(times)) == pytest.approx(0.1, rel=0.05)


def test_bad_laws_are_refused() -> None:
    for bad in ({"q_ms": 0.0}, {"s_ms": float("inf")}, {"sigma": -0.1}, {"noise": 1000.0},
                {"q_ms": 1e-300}, {"q_ms": 1e300}, {"s_ms": 1e300}):  # steps or their ratios past a float
        with pytest.raises(ValueError):
            SpeedLaw(**bad)
    for text in ("gpu:0.1", "gpu:1e-300:0,cpu:1:0", "gpu:1:1e300"):
        with pytest.raises(ValueError):
            parse_classes(text)


def test_given_laws_are_taken_in_order_and_cycled_and_bad_ones_refused() -> None:
    law = SpeedLaw(given=[(1.0, 5.0), (2.0, 0.0)])
    pop = Population(law, np.random.default_rng(0))
    pop.add(2)
    pop.add(1)  # a third worker, joining later: the list cycles
    assert pop.q.tolist() == [1.0, 2.0, 1.0] and pop.s.tolist() == [5.0, 0.0, 5.0]
    with pytest.raises(ValueError, match="given laws"):
        SpeedLaw(given=[(0.0, 1.0)])

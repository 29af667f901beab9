"""ps.control.model.balance: which workers the times in force measure finishing early (pure)."""

from __future__ import annotations

from ps.control.model.balance import measured_early


def test_a_worker_early_by_more_than_the_deadband_and_the_noise_is_measured_early() -> None:
    times = {"a": [500.0, 505.0, 498.0], "b": [580.0, 585.0, 578.0], "c": [560.0, 590.0, 575.0]}
    assert measured_early(times, 0.1) == ["a"]
    assert measured_early(times, 0.15) == []  # 14% early: within a deadband of 15%


def test_noise_wider_than_the_gap_measures_no_worker_early() -> None:
    times = {"a": [400.0, 600.0], "b": [580.0, 585.0]}  # a's mean is 17% early, its standard error 100 ms
    assert measured_early(times, 0.1) == []
    assert measured_early({"a": [500.0]}, 0.1) == []  # one worker: no round to be early against


def test_the_means_given_are_used() -> None:
    times = {"a": [500.0, 501.0], "b": [580.0, 581.0]}
    assert measured_early(times, 0.1, means={"a": 570.0, "b": 580.0}) == []

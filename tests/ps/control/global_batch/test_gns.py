"""Tests for ps.control.global_batch.gns, the N-worker gradient noise scale estimator."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ps.control.global_batch.gns import (
    NoiseScaleEstimator,
    combine_round,
    statistical_efficiency,
    successive_pair,
    worker_pairs,
    worker_weights,
)
from tests.simulated_gradients import HL8_BATCHES, Gradients, feed, norms, round_with

FAST = settings(max_examples=60, deadline=None)
# ---------------------------------------------------------------- convergence to the known noise scale


@pytest.mark.parametrize("kind", ["gaussian", "exponential"])
@pytest.mark.parametrize(("noise_scale", "rounds", "tolerance"),
                         [(4.0, 1500, 0.05), (256.0, 1500, 0.1), (1000.0, 3000, 0.2)])
def test_estimator_converges_to_the_known_noise_scale_on_an_unequal_split(
        kind: str, noise_scale: float, rounds: int, tolerance: float) -> None:
    """Tolerances are about 3 standard deviations of φ (measured over seeds); B_noise >> B is the hard case."""
    grads = Gradients(seed=int(noise_scale), noise_scale=noise_scale, kind=kind)
    local, overall = norms(HL8_BATCHES, grads.worker_means(HL8_BATCHES, rounds=rounds))
    est = NoiseScaleEstimator(smoothing=1.0 - 1.0 / rounds)
    feed(est, HL8_BATCHES, local, overall)
    got = est.estimate()
    assert got.known and got.rounds == rounds
    assert got.noise == pytest.approx(grads.trace, rel=0.05)
    assert got.phi == pytest.approx(noise_scale, rel=tolerance)


def test_single_worker_estimates_from_successive_rounds_at_two_batch_sizes() -> None:
    grads = Gradients(seed=5, noise_scale=64.0)
    est = NoiseScaleEstimator(smoothing=0.998)
    small, big = (norms((b,), grads.worker_means((b,), rounds=600))[1] for b in (16, 128))
    for x_small, x_big in zip(small, big):
        est.observe([16], [float(x_small)], float(x_small))
        est.observe([128], [float(x_big)], float(x_big))
    got = est.estimate()
    assert got.rounds == 1199  # every round after the first pairs with its predecessor
    assert got.phi == pytest.approx(64.0, rel=0.15)


def test_a_lone_worker_estimates_every_round_from_its_batch_and_its_first_half() -> None:
    """A sub-batch inside the round's own batch: no earlier round, no change of batch needed."""
    grads = Gradients(seed=7, noise_scale=64.0)
    est = NoiseScaleEstimator(smoothing=0.998)
    halves = grads.worker_means((64, 64), rounds=800)  # the first 64 samples and the other 64 of a batch of 128
    for first, second in halves:
        whole = (first + second) / 2.0
        assert est.observe_sub(128, float(whole @ whole), 64, float(first @ first)) is True
    got = est.estimate()
    assert got.rounds == 800
    assert got.phi == pytest.approx(64.0, rel=0.15)


def test_a_sub_batch_round_breaks_the_chain_of_single_rounds_and_bad_ones_change_nothing() -> None:
    est = NoiseScaleEstimator()
    est.observe([64], [2.0], 2.0)
    est.observe_sub(64, 2.0, 32, 2.2)
    assert est.observe([32], [3.0], 3.0) is False and est.estimate().rounds == 1
    before = est.state_dict()
    for batch, sub, sub_norm, needle in ((64, 64, 2.0, "part of the batch"), (64, 0, 2.0, ">= 1"),
                                          (1, 1, 2.0, ">= 2"), (64, 32, -1.0, "squared gradient norm")):
        with pytest.raises(ValueError, match=needle):
            est.observe_sub(batch, 2.0, sub, sub_norm)
    assert est.state_dict() == before


# ---------------------------------------------------------------- the Theorem 4.1 weights


def gaussian_covariances(b: np.ndarray, linear: float, quadratic: float) -> tuple[np.ndarray, np.ndarray]:
    """Cov(G_i, G_j) and Cov(S_i, S_j) for Gaussian noise; linear = GᵀΣG, quadratic = tr(Σ²)."""
    big, eye = b.sum(), np.eye(len(b))
    rows, cols = np.meshgrid(b, b, indexing="ij")
    denom = (big - rows) * (big - cols)
    cov_g = (4 * linear * (big - rows - cols + eye * rows) / denom
             + 2 * quadratic * (big - rows - cols + eye * big) / (big * denom))
    cov_s = 4 * linear * big * rows * (eye * big - cols) / denom + 2 * quadratic * (eye * big ** 2 - rows * cols) / denom
    return cov_g, cov_s


def best_weights(cov: np.ndarray) -> np.ndarray:
    """Theorem 4.1: w = C⁻¹1 / 1ᵀC⁻¹1."""
    w = np.linalg.solve(cov, np.ones(len(cov)))
    return w / w.sum()


def test_the_covariance_formulas_match_simulated_gradients() -> None:
    grads = Gradients(seed=11, noise_scale=40.0, dim=16)
    local, overall = norms(HL8_BATCHES, grads.worker_means(HL8_BATCHES, rounds=6000))
    pairs = [worker_pairs(HL8_BATCHES, y.tolist(), float(x)) for y, x in zip(local, overall)]
    signals, noises = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    sigma = np.diag(grads.spectrum)
    cov_g, cov_s = gaussian_covariances(np.array(HL8_BATCHES, float), float(grads.mean @ sigma @ grads.mean),
                                        float(np.trace(sigma @ sigma)))
    assert signals.mean(0) == pytest.approx([grads.signal] * 4, rel=0.05)  # unbiased, each worker
    assert noises.mean(0) == pytest.approx([grads.trace] * 4, rel=0.1)
    assert np.abs(np.cov(signals.T) - cov_g).max() <= 0.1 * np.abs(cov_g).max()
    assert np.abs(np.cov(noises.T) - cov_s).max() <= 0.1 * np.abs(cov_s).max()


@FAST
@given(
    batches=st.lists(st.integers(1, 500), min_size=2, max_size=8),
    linear=st.floats(0.0, 1e3),
    quadratic=st.floats(1e-3, 1e3),
)
def test_weights_are_theorem_4_1_minimum_variance_for_any_signal_to_noise(
        batches: list[int], linear: float, quadratic: float) -> None:
    b = np.array(batches, dtype=np.float64)
    for cov in gaussian_covariances(b, linear, quadratic):
        assert np.allclose(best_weights(cov), worker_weights(batches), rtol=1e-6, atol=1e-9)


def test_weights_beat_cannikins_printed_matrices_and_plain_averages() -> None:
    """Cannikin's A_G, A_S (from its Lemma B.5) give other weights; on simulated rounds they, and plain
    averages, have a larger variance than the weights used here."""
    b = np.array(HL8_BATCHES, dtype=np.float64)
    big, eye = b.sum(), np.eye(4)
    rows, cols = np.meshgrid(b, b, indexing="ij")
    a_g = np.where(eye == 1, (big + 2 * rows) / (big ** 2 - big * rows),
                   (big ** 2 - rows ** 2 - cols ** 2) / (big * (big - rows) * (big - cols)))
    a_s = np.where(eye == 1, big * rows / (big - rows), rows * cols * (big - rows - cols) / ((big - rows) * (big - cols)))
    grads = Gradients(seed=3, noise_scale=8.0, dim=64)
    local, overall = norms(HL8_BATCHES, grads.worker_means(HL8_BATCHES, rounds=4000))
    pairs = [worker_pairs(HL8_BATCHES, y.tolist(), float(x)) for y, x in zip(local, overall)]
    signals, noises = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    ours, plain = worker_weights(HL8_BATCHES), np.full(4, 0.25)
    for values, paper in ((signals, best_weights(a_g)), (noises, best_weights(a_s))):
        spread = {name: float((values @ w).std()) for name, w in (("ours", ours), ("paper", paper), ("plain", plain))}
        assert spread["ours"] < spread["paper"] and spread["ours"] < spread["plain"], spread


@FAST
@given(n=st.integers(2, 8), batch=st.integers(1, 300), data=st.data())
def test_equal_batches_give_plain_averages(n: int, batch: int, data: st.DataObject) -> None:
    local = data.draw(st.lists(st.floats(0.01, 100.0), min_size=n, max_size=n))
    overall = data.draw(st.floats(0.0, 1.0)) * sum(local) / n  # any |g|² Jensen allows
    batches = [batch] * n
    assert np.allclose(worker_weights(batches), 1.0 / n)
    signals, noises = worker_pairs(batches, local, overall)
    got = combine_round(batches, local, overall)
    assert got.signal == pytest.approx(signals.mean(), rel=1e-9, abs=1e-9)
    assert got.noise == pytest.approx(max(0.0, noises.mean()), rel=1e-9, abs=1e-9)


round_inputs = st.integers(2, 6).flatmap(lambda n: st.tuples(
    st.lists(st.integers(1, 400), min_size=n, max_size=n),
    st.lists(st.floats(0.01, 100.0), min_size=n, max_size=n),
    st.floats(0.0, 1.0),
))


def consistent(batches: list[int], local: list[float], fraction: float) -> float:
    """A |g|² that Jensen allows: a fraction of the batch-weighted mean of the |g_k|²."""
    return fraction * float(np.dot(batches, local)) / sum(batches)


@FAST
@given(case=round_inputs)
def test_combination_is_the_pooled_estimator(case: tuple[list[int], list[float], float]) -> None:
    batches, local, fraction = case
    overall = consistent(batches, local, fraction)
    got = combine_round(batches, local, overall)
    pooled = (np.dot(batches, local) - sum(batches) * overall) / (len(batches) - 1)
    assert math.isclose(sum(worker_weights(batches)), 1.0)
    assert got.noise == pytest.approx(pooled, rel=1e-9, abs=1e-9)
    assert got.signal == pytest.approx(overall - pooled / sum(batches), rel=1e-9, abs=1e-9)


@FAST
@given(case=round_inputs, seed=st.integers(0, 2 ** 32 - 1), scale=st.floats(1e-3, 1e3))
def test_permuting_workers_changes_nothing_and_scaling_gradients_keeps_phi(
        case: tuple[list[int], list[float], float], seed: int, scale: float) -> None:
    batches, local, fraction = case
    overall = consistent(batches, local, fraction)
    order = np.random.default_rng(seed).permutation(len(batches))
    base = combine_round(batches, local, overall)
    permuted = combine_round([batches[i] for i in order], [local[i] for i in order], overall)
    assert permuted.signal == pytest.approx(base.signal, rel=1e-9, abs=1e-9)
    assert permuted.noise == pytest.approx(base.noise, rel=1e-9, abs=1e-9)
    squared = scale ** 2  # gradients times c: every squared norm times c²
    scaled = combine_round(batches, [v * squared for v in local], overall * squared)
    assert scaled.signal == pytest.approx(base.signal * squared, rel=1e-6, abs=1e-9 * squared)
    assert scaled.noise == pytest.approx(base.noise * squared, rel=1e-6, abs=1e-9 * squared)
    one, other = NoiseScaleEstimator(), NoiseScaleEstimator()
    one.observe(batches, local, overall)
    other.observe(batches, [v * squared for v in local], overall * squared)
    if abs(base.signal) > 1e-6 * base.noise:  # else rounding may flip the sign of a ~0 signal
        assert one.estimate().known == other.estimate().known == (base.signal > 0)
    if one.estimate().known and base.signal > 1e-6 * base.noise:
        assert other.estimate().phi == pytest.approx(one.estimate().phi, rel=1e-6)


# ---------------------------------------------------------------- smoothing and unknown states


def test_smoothing_averages_numerator_and_denominator_not_the_ratio() -> None:
    est = NoiseScaleEstimator(smoothing=0.5)
    rounds = [(1.0, 10.0), (4.0, 8.0)]  # (signal, noise) per round
    for signal, noise in rounds:
        est.observe(*round_with(signal, noise))
    got = est.estimate()
    signal = (0.5 * 1.0 + 4.0) / 1.5
    noise = (0.5 * 10.0 + 8.0) / 1.5
    assert got.signal == pytest.approx(signal) and got.noise == pytest.approx(noise)
    assert got.phi == pytest.approx(noise / signal)
    assert got.phi != pytest.approx((0.5 * 10.0 + 2.0) / 1.5)  # the smoothed ratio would be this


def test_a_negative_signal_estimate_is_unknown_and_kept_in_the_sums() -> None:
    est = NoiseScaleEstimator(smoothing=0.5)
    assert est.estimate().reason == "no round observed yet" and not est.estimate().known
    est.observe([1, 1], [1.0, 1.0], 0.0)  # g_1 = −g_2: all noise, G = 0 − S/B < 0
    got = est.estimate()
    assert got.phi is None and got.signal == pytest.approx(-1.0) and got.noise == pytest.approx(2.0)
    assert "|G|² <= 0" in got.reason and got.rounds == 1
    est.observe(*round_with(signal=5.0, noise=2.0))
    later = est.estimate()
    assert later.known and later.signal == pytest.approx((0.5 * -1.0 + 5.0) / 1.5)


def test_one_worker_is_unknown_until_its_batch_size_changes() -> None:
    est = NoiseScaleEstimator()
    assert est.observe([64], [2.0], 2.0) is False
    assert est.observe([64], [2.1], 2.1) is False
    got = est.estimate()
    assert got.phi is None and got.rounds == 0 and "two batch sizes" in got.reason
    assert est.observe([0, 32], [0.0, 3.0], 3.0) is True  # a parked worker: still one worker, b_k = B
    expected = successive_pair(64, 2.1, 32, 3.0)
    assert est.estimate().signal == pytest.approx(expected.signal)
    assert est.estimate().noise == pytest.approx(expected.noise)


def test_a_round_of_several_workers_breaks_the_chain_of_single_rounds() -> None:
    est = NoiseScaleEstimator()
    est.observe([64], [2.0], 2.0)
    est.observe(*round_with(1.0, 1.0))
    assert est.observe([32], [3.0], 3.0) is False and est.estimate().rounds == 1


def test_successive_pair_is_unbiased_and_needs_two_batch_sizes() -> None:
    got = successive_pair(10, 2.0 + 5.0 / 10, 50, 2.0 + 5.0 / 50)  # exact expectations
    assert got.signal == pytest.approx(2.0) and got.noise == pytest.approx(5.0)
    with pytest.raises(ValueError, match="different batch sizes"):
        successive_pair(8, 1.0, 8, 1.0)


def test_parked_workers_are_dropped() -> None:
    with_parked = combine_round([0, 10, 30, 0], [9.0, 2.0, 1.5, 7.0], 1.5)
    assert with_parked == combine_round([10, 30], [2.0, 1.5], 1.5)
    assert len(worker_pairs([0, 10, 30], [9.0, 2.0, 1.5], 1.5)[0]) == 2


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("batches", "local", "overall", "needle"),
    [
        ([4, 4], [1.0], 1.0, "2 batch sizes but 1 gradient norms"),
        ([4, -1], [1.0, 1.0], 1.0, "batch size of worker 1 must be >= 0"),
        ([4, 2.5], [1.0, 1.0], 1.0, "batch size of worker 1 must be a whole number"),
        ([True, 4], [1.0, 1.0], 1.0, "batch size of worker 0 must be a whole number"),
        ([4, 4], [1.0, float("nan")], 1.0, "squared gradient norm of worker 1 must be a finite number"),
        ([4, 4], [-1.0, 1.0], 0.0, "squared gradient norm of worker 0 must be in [0, inf]"),
        ([4, 4], [1.0, 1.0], float("inf"), "squared norm of the global gradient must be a finite number"),
        ([4, 4], [1.0, 1.0], 1.5, "exceeds the batch-weighted mean"),
        ([0, 0], [1.0, 1.0], 1.0, "no worker contributed"),
    ],
)
def test_bad_rounds_are_one_value_error_and_change_nothing(batches: list, local: list, overall: float,
                                                           needle: str) -> None:
    est = NoiseScaleEstimator()
    est.observe(*round_with(1.0, 2.0))
    before = est.state_dict()
    with pytest.raises(ValueError) as caught:
        est.observe(batches, local, overall)
    assert needle in str(caught.value) and "\n" not in str(caught.value)
    assert est.state_dict() == before


def test_pairs_and_weights_need_two_workers() -> None:
    with pytest.raises(ValueError, match="one worker has no pair"):
        worker_pairs([0, 8], [1.0, 1.0], 1.0)
    with pytest.raises(ValueError, match="one worker has no pair"):
        worker_weights([8])
    with pytest.raises(ValueError, match="smoothing must be in"):
        NoiseScaleEstimator(smoothing=1.0)


# ---------------------------------------------------------------- statistical efficiency


@FAST
@given(phi=st.floats(0.0, 1e5), base=st.integers(1, 4096), batch=st.integers(1, 4096))
def test_efficiency_is_one_at_the_base_batch_and_falls_as_the_batch_grows(phi: float, base: int, batch: int) -> None:
    eff = statistical_efficiency(phi, batch, base)
    assert statistical_efficiency(phi, base, base) == 1.0
    assert eff <= 1.0 if batch >= base else eff >= 1.0
    assert statistical_efficiency(phi, batch + 1, base) <= eff
    if batch >= base:  # yet the progress per step, B·E(B), does not fall
        assert batch * eff >= base * (1 - 1e-12)


def test_efficiency_values_and_bad_arguments() -> None:
    assert statistical_efficiency(0.0, 256, 32) == pytest.approx(32 / 256)  # no noise: only steps count
    assert statistical_efficiency(1e12, 256, 32) == pytest.approx(1.0)  # all noise: only samples count
    assert statistical_efficiency(100.0, 200, 100) == pytest.approx(200 / 300)
    with pytest.raises(ValueError, match="phi must be in"):
        statistical_efficiency(-1.0, 256, 32)
    with pytest.raises(ValueError, match="batch must be in"):
        statistical_efficiency(1.0, 0, 32)

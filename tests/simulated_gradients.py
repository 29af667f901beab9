"""Simulated gradients with a known noise scale, and the squared norms a BSP round of them gives: what the
noise-scale estimator's tests (tests/ps/control/global_batch/test_gns*.py) feed it."""

from __future__ import annotations

import math

import numpy as np

from ps.control.global_batch.gns import NoiseScaleEstimator

HL8_BATCHES = (32, 32, 21, 171)  # 6/6/4/32 shares of B = 256


class Gradients:
    """Per-sample gradients G + noise in d dimensions with known |G|² and tr(Σ).

    The noise is a decaying spectrum (eigenvalues ∝ 1/i, as real gradient noise is far from
    isotropic) times unit-variance draws: Gaussian or a centred exponential (skewed, heavy-tailed)."""

    def __init__(self, seed: int, noise_scale: float, dim: int = 32, kind: str = "gaussian") -> None:
        self.rng = np.random.default_rng(seed)
        self.spectrum = 1.0 / np.arange(1, dim + 1)
        direction = self.rng.normal(size=dim)
        self.mean = direction * math.sqrt(self.trace / noise_scale / (direction @ direction))
        self.kind = kind

    @property
    def trace(self) -> float:
        return float(self.spectrum.sum())

    @property
    def signal(self) -> float:
        return float(self.mean @ self.mean)

    def worker_means(self, batches: tuple[int, ...], rounds: int) -> np.ndarray:
        """(rounds, workers, dim): each worker's mean over its b_k fresh per-sample gradients."""
        means = np.empty((rounds, len(batches), len(self.mean)))
        for k, b in enumerate(batches):
            shape = (rounds, b, len(self.mean))
            z = self.rng.normal(size=shape) if self.kind == "gaussian" else self.rng.exponential(size=shape) - 1.0
            means[:, k] = self.mean + (z * np.sqrt(self.spectrum)).mean(axis=1)
        return means


def norms(batches: tuple[int, ...], means: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per round: the |g_k|² (rounds, workers) and |g|² of the batch-weighted mean (rounds,)."""
    b = np.asarray(batches, dtype=np.float64)
    overall = np.einsum("k,rkd->rd", b / b.sum(), means)
    return (means ** 2).sum(-1), (overall ** 2).sum(-1)


def feed(est: NoiseScaleEstimator, batches: tuple[int, ...], local: np.ndarray, overall: np.ndarray) -> None:
    for y, x in zip(local, overall):
        est.observe(batches, y.tolist(), float(x))


def round_with(signal: float, noise: float, batch: int = 4) -> tuple[list[int], list[float], float]:
    """Two workers of `batch` samples whose round estimates are exactly (signal, noise)."""
    big = 2 * batch
    overall = signal + noise / big
    spread = noise / batch  # Σ b_k y_k − B x = b (y1 + y2) − 2b x = noise (N − 1 = 1)
    return [batch, batch], [overall + spread / 2, overall + spread / 2], overall

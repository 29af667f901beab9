"""Gradient noise scale (GNS) of a BSP job from the workers' gradient norms (McCandlish et al., "An
Empirical Model of Large-Batch Training").

B_noise = tr(Σ)/|G|², with G the true gradient and Σ the per-sample gradient covariance. A round gives,
per worker k, the squared norm y_k = |g_k|² of its mean gradient over b_k samples and x = |g|² of the
batch-weighted mean over B = Σ b_k. Since E|g_b|² = |G|² + tr(Σ)/b, each worker yields McCandlish et
al.'s unbiased pair (small batch b_k, big batch B):

    G_k = (B x − b_k y_k)/(B − b_k),    S_k = (y_k − x)/(1/b_k − 1/B).

Combining weights (Cannikin Theorem 4.1: w = C⁻¹1 / 1ᵀC⁻¹1, C the covariance of the G_k, or of the
S_k). Write g_k = G + u_k/b_k, u_k the sum of b_k per-sample noises (covariance b_k Σ, independent
across workers), and ū_{−k} = Σ_{j≠k} u_j/(B − b_k). Up to the mean, G_k = 2Gᵀū_{−k} + Q_k and S_k = 2Gᵀ(B u_k − b_k Σu)/(B − b_k) + Q'_k:
a linear part (covariance ∝ GᵀΣG) and a quadratic one (∝ tr(Σ²), Gaussian u; it dominates while
B < B_noise). Working both out:

    Cov(G_i, G_j) = 4GᵀΣG (B − b_i − b_j + δ_ij b_i)/((B−b_i)(B−b_j))
                    + 2tr(Σ²) (B − b_i − b_j + δ_ij B)/(B (B−b_i)(B−b_j)),
    Cov(S_i, S_j) = 4GᵀΣG B b_i (δ_ij B − b_j)/((B−b_i)(B−b_j))
                    + 2tr(Σ²) (δ_ij B² − b_i b_j)/((B−b_i)(B−b_j)).

For w_k = (B − b_k)/((N − 1) B) each of the four matrices times w is a constant vector, so C w ∝ 1
whatever GᵀΣG and tr(Σ²) are: these are the minimum-variance weights for both estimators, and equal
b_k make them 1/N (plain averages). The combination has a closed form, the pooled estimator:

    S = (Σ b_k y_k − B x)/(N − 1) = Σ b_k |g_k − g|² / (N − 1) >= 0,    G = x − S/B.

Cannikin's printed matrices A_G, A_S differ: its Lemma B.5 takes Cov(|g|², |g_k|²) = 4b_k|G|²tr(Σ)/B²,
but g contains g_k with weight b_k/B, so it is Var(|g|²) ≈ 4GᵀΣG/B, and the quadratic part is left
out. On simulated gradients the weights above have the lower variance
(tests/ps/control/global_batch/test_gns.py).

One worker (b_1 = B) has no pair of workers inside a round. It has one where it measures |g_s|² of the
mean gradient over the first s samples of its batch too (the project's worker does: its first half), the
pair (s, B) within the round; else two successive rounds at different batch sizes b, b' give one: in
both, S = (y − y')/(1/b − 1/b'), G = (b y − b' y')/(b − b'). Rounds are smoothed with an
EWMA of the S and the G separately (a ratio of noisy estimates is biased), and φ = S̄/Ḡ is reported
only while Ḡ > 0 and S̄ >= 0: early in training, or at a minimum, G can come out negative from noise,
and the estimate is then "unknown", never a made-up number.

The uncertainty of φ comes from the spread of the rounds' estimates under the same weights: the
EWMA's weighted variances of S, G and their covariance, divided by the effective number of rounds
(Σw)²/Σw², carried to φ = S̄/Ḡ by the delta method, Var φ ≈ (Var S − 2φ Cov(S, G) + φ² Var G)/Ḡ².
--adaptive-batch moves B only on a predicted gain larger than what this spread could explain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import math

import numpy as np

from common.number_checks import finite, real_number, whole

STATE_FORMAT = "gns/2"
"""Format written by `NoiseScaleEstimator.state_dict`; `from_state_dict` reads it and "gns/1" (the
same without the sums of squares: its rounds read back with no spread, which the rounds after add)."""

_STATE_KEYS_1 = frozenset({"format", "smoothing", "signal_sum", "noise_sum", "rounds", "previous_single"})
_SQUARES = ("noise_sq_sum", "signal_sq_sum", "cross_sum")
_STATE_KEYS = _STATE_KEYS_1 | frozenset(_SQUARES)
_JENSEN_SLACK = 1e-5
"""Relative slack for B|g|² <= Σ b_k |g_k|² (exact in real numbers; norms summed in float32 round)."""


@dataclass(frozen=True)
class RoundEstimate:
    """One round's unbiased estimates: signal of |G|², noise of tr(Σ)."""

    signal: float
    noise: float


@dataclass(frozen=True)
class NoiseScale:
    """The smoothed estimate. `phi` (B_noise) is None while unknown, and `reason` then says why."""

    signal: float | None
    noise: float | None
    phi: float | None
    rounds: int
    reason: str
    phi_sd: float | None = None
    """The standard error of φ from the rounds' spread; None while φ is unknown or one round backs it."""

    @property
    def known(self) -> bool:
        return self.phi is not None


def _batches(batches: Sequence[Any]) -> np.ndarray:
    """Validated batch sizes as floats (whole numbers >= 0)."""
    return np.array([whole(f"batch size of worker {k}", v, 0) for k, v in enumerate(batches)], dtype=np.float64)


def _round_inputs(batches: Sequence[Any], local_sq_norms: Sequence[Any], global_sq_norm: Any
                  ) -> tuple[np.ndarray, np.ndarray, float]:
    """Validated (b, y, x) of the contributing workers (b_k = 0, a parked worker, is dropped)."""
    if len(batches) != len(local_sq_norms):
        raise ValueError(f"got {len(batches)} batch sizes but {len(local_sq_norms)} gradient norms")
    b = _batches(batches)
    y = np.array([finite(f"squared gradient norm of worker {k}", v, 0.0) for k, v in enumerate(local_sq_norms)],
                 dtype=np.float64)
    x = finite("squared norm of the global gradient", global_sq_norm, 0.0)
    active = b > 0
    if not active.any():
        raise ValueError("no worker contributed to the round (all batch sizes are 0)")
    b, y = b[active], y[active]
    weighted = float(b @ y)
    if b.sum() * x > weighted * (1.0 + _JENSEN_SLACK):
        raise ValueError(f"|g|² = {x:g} exceeds the batch-weighted mean of the |g_k|² ({weighted / b.sum():g}); "
                         "|g|² must be the squared norm of the batch-weighted mean of the g_k")
    return b, y, x


def _pairs(b: np.ndarray, y: np.ndarray, x: float) -> tuple[np.ndarray, np.ndarray]:
    big = b.sum()
    return (big * x - b * y) / (big - b), (y - x) / (1.0 / b - 1.0 / big)


def _weights(b: np.ndarray) -> np.ndarray:
    weights: np.ndarray = (b.sum() - b) / ((len(b) - 1) * b.sum())
    return weights


def _needs_two(b: np.ndarray) -> None:
    if len(b) < 2:
        raise ValueError("one worker has no pair within a round (b_k = B); see NoiseScaleEstimator")


def worker_pairs(batches: Sequence[int], local_sq_norms: Sequence[float], global_sq_norm: float
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Each contributing worker's unbiased (G_k, S_k); needs two or more workers with b_k > 0."""
    b, y, x = _round_inputs(batches, local_sq_norms, global_sq_norm)
    _needs_two(b)
    return _pairs(b, y, x)


def worker_weights(batches: Sequence[int]) -> np.ndarray:
    """Minimum-variance weights w_k = (B − b_k)/((N − 1) B) of the contributing workers (sum 1)."""
    b = _batches(batches)
    b = b[b > 0]
    _needs_two(b)
    return _weights(b)


def combine_round(batches: Sequence[int], local_sq_norms: Sequence[float], global_sq_norm: float) -> RoundEstimate:
    """The round's minimum-variance unbiased estimates Σ w_k G_k and Σ w_k S_k (two or more workers)."""
    b, y, x = _round_inputs(batches, local_sq_norms, global_sq_norm)
    _needs_two(b)
    return _combine(b, y, x)


def _combine(b: np.ndarray, y: np.ndarray, x: float) -> RoundEstimate:
    signals, noises = _pairs(b, y, x)
    w = _weights(b)
    return RoundEstimate(signal=float(w @ signals), noise=max(0.0, float(w @ noises)))


def successive_pair(batch: int, sq_norm: float, next_batch: int, next_sq_norm: float) -> RoundEstimate:
    """Unbiased estimates from the squared norms of mean gradients at two batch sizes: two rounds of one
    worker (which assumes G and Σ held between them), or a lone worker's batch and its first part."""
    b = whole("batch size", batch, 1)
    b2 = whole("next batch size", next_batch, 1)
    if b == b2:
        raise ValueError(f"successive rounds need different batch sizes, got {b} twice")
    y = finite("squared gradient norm", sq_norm, 0.0)
    y2 = finite("next squared gradient norm", next_sq_norm, 0.0)
    return RoundEstimate(signal=(b * y - b2 * y2) / (b - b2), noise=(y - y2) / (1.0 / b - 1.0 / b2))


def statistical_efficiency(phi: float, batch: float, base_batch: float) -> float:
    """Pollux's efficiency of batch B relative to B₀: (φ + B₀)/(φ + B), the progress per sample."""
    phi = finite("phi", phi, 0.0)
    batch = finite("batch", batch, 0.0, open_low=True)
    base_batch = finite("base_batch", base_batch, 0.0, open_low=True)
    return (phi + base_batch) / (phi + batch)


class NoiseScaleEstimator:
    """EWMA over rounds of the combined signal and noise estimates; `estimate` gives φ = S̄/Ḡ.

    `smoothing` is the weight kept by the history per round (0: the last round only); the default
    0.98 (~100 rounds' worth) kept φ within 15% of the truth at B = 256 in benchmarks.gns_check,
    0.95 within 26%. The sums are divided by the sum of the weights, 1 + smoothing + ... (n rounds),
    so early rounds are not pulled towards 0."""

    def __init__(self, smoothing: float = 0.98) -> None:
        self.smoothing = finite("smoothing", smoothing, 0.0, 1.0, open_high=True)
        self._signal_sum = 0.0
        self._noise_sum = 0.0
        self._squares = [0.0, 0.0, 0.0]  # weighted sums of S², G² and S·G (_SQUARES)
        self._rounds = 0
        self._previous_single: tuple[int, float] | None = None

    def observe(self, batches: Sequence[int], local_sq_norms: Sequence[float], global_sq_norm: float) -> bool:
        """Take one BSP round; returns whether it added an estimate. Bad input raises ValueError and
        changes nothing. A one-worker round adds one only if the previous round had one worker at
        another batch size; otherwise it is remembered for the next."""
        b, y, x = _round_inputs(batches, local_sq_norms, global_sq_norm)
        if len(b) >= 2:
            self._previous_single = None
            self._add(_combine(b, y, x))
            return True
        current = (int(b[0]), x)
        previous, self._previous_single = self._previous_single, current
        if previous is None or previous[0] == current[0]:
            return False
        self._add(successive_pair(*previous, *current))
        return True

    def observe_sub(self, batch: int, sq_norm: float, sub_batch: int, sub_sq_norm: float) -> bool:
        """Take one round of a lone worker that measured |g_s|² over the first `sub_batch` samples of its
        batch besides |g|² over all of it: the pair (sub_batch, batch) of the round itself, no earlier
        round needed. Returns True; bad input raises ValueError and changes nothing."""
        b = whole("batch size", batch, 2)
        sub = whole("sub-batch", sub_batch, 1)
        if sub >= b:
            raise ValueError(f"a sub-batch is part of the batch: needs 1 <= {sub} < {b}")
        estimate = successive_pair(sub, sub_sq_norm, b, sq_norm)
        self._previous_single = None
        self._add(estimate)
        return True

    def _add(self, estimate: RoundEstimate) -> None:
        keep = self.smoothing
        self._signal_sum = keep * self._signal_sum + estimate.signal
        self._noise_sum = keep * self._noise_sum + estimate.noise
        fresh = (estimate.noise ** 2, estimate.signal ** 2, estimate.noise * estimate.signal)
        self._squares = [keep * old + new for old, new in zip(self._squares, fresh, strict=True)]
        self._rounds += 1

    def _weights(self) -> tuple[float, float]:
        """Σw and Σw² of the rounds taken (w = smoothing^age)."""
        keep, n = self.smoothing, self._rounds
        if keep == 0.0:
            return 1.0, 1.0
        return (1.0 - keep ** n) / (1.0 - keep), (1.0 - keep ** (2 * n)) / (1.0 - keep ** 2)

    def _phi_sd(self, signal: float, noise: float) -> float | None:
        """The standard error of φ = noise/signal (the module's delta method); None with one round's worth."""
        weight, weight_sq = self._weights()
        effective = weight * weight / weight_sq
        if effective <= 1.0 + 1e-9:
            return None
        unbias = effective / (effective - 1.0)
        var_s = max(0.0, self._squares[0] / weight - noise * noise) * unbias
        var_g = max(0.0, self._squares[1] / weight - signal * signal) * unbias
        cov = (self._squares[2] / weight - noise * signal) * unbias
        phi = noise / signal
        return math.sqrt(max(0.0, var_s - 2.0 * phi * cov + phi * phi * var_g) / effective) / signal

    def estimate(self) -> NoiseScale:
        """The smoothed |G|², tr(Σ) and φ, or why φ is unknown."""
        if self._rounds == 0:
            reason = ("one worker at one batch size: needs successive rounds at two batch sizes"
                      if self._previous_single is not None else "no round observed yet")
            return NoiseScale(None, None, None, 0, reason)
        weight = self._weights()[0]
        signal, noise = self._signal_sum / weight, self._noise_sum / weight
        if signal <= 0.0:
            reason = "gradient signal estimate |G|² <= 0 (noise-dominated)"
            return NoiseScale(signal, noise, None, self._rounds, reason)
        if noise < 0.0:
            return NoiseScale(signal, noise, None, self._rounds, "gradient noise estimate tr(Σ) < 0")
        return NoiseScale(signal, noise, noise / signal, self._rounds, "", self._phi_sd(signal, noise))

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable state (for checkpoints)."""
        return {
            "format": STATE_FORMAT,
            "smoothing": self.smoothing,
            "signal_sum": self._signal_sum,
            "noise_sum": self._noise_sum,
            "rounds": self._rounds,
            "previous_single": None if self._previous_single is None else list(self._previous_single),
            **dict(zip(_SQUARES, self._squares, strict=True)),
        }

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> NoiseScaleEstimator:
        """Rebuild from `state_dict` output; raises ValueError on malformed or inconsistent state."""
        if not isinstance(state, Mapping):
            raise ValueError(f"GNS state must be a mapping, got {type(state).__name__}")
        if state.get("format") not in (STATE_FORMAT, "gns/1"):
            raise ValueError(f"unsupported GNS state format {state.get('format')!r} (expected {STATE_FORMAT!r} or 'gns/1')")
        keys = _STATE_KEYS if state["format"] == STATE_FORMAT else _STATE_KEYS_1
        if set(state) != keys:
            raise ValueError(f"GNS state must have exactly the keys {sorted(keys)}, got {sorted(state)}")
        est = cls(state["smoothing"])
        rounds = whole("rounds", state["rounds"], 0)
        for key in ("signal_sum", "noise_sum", *(_SQUARES if keys is _STATE_KEYS else ())):
            if real_number(state[key]) is None:
                raise ValueError(f"{key} must be a finite number, got {state[key]!r}")
        if rounds == 0 and (state["signal_sum"] != 0 or state["noise_sum"] != 0):
            raise ValueError("GNS state has sums but no rounds")
        previous = state["previous_single"]
        if previous is not None:
            if not isinstance(previous, (list, tuple)) or len(previous) != 2:
                raise ValueError(f"previous_single must be null or [batch, squared norm], got {previous!r}")
            est._previous_single = (whole("previous batch", previous[0], 1),
                                    finite("previous squared norm", previous[1], 0.0))
        est._signal_sum, est._noise_sum = float(state["signal_sum"]), float(state["noise_sum"])
        est._rounds = rounds
        if keys is _STATE_KEYS:
            est._squares = [float(state[key]) for key in _SQUARES]
        elif rounds:  # gns/1: each round at the means, no spread yet
            weight = est._weights()[0]
            noise, signal = est._noise_sum / weight, est._signal_sum / weight
            est._squares = [noise * noise * weight, signal * signal * weight, noise * signal * weight]
        return est


"""OmniLearn's proportional law: each worker's target batch from its measured time (Eq. 6), the ASP
variant that keeps the total, and the deadband that decides whether a change is worth making (Eq. 7)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from ps.control.checks import positive, real, same_keys


def proportional_targets(batches: Mapping[str, int], times_ms: Mapping[str, float]) -> dict[str, float]:
    """Eq. 6: target b_k' = T_k * t_bar with throughput T_k = b_k / t_k and t_bar = mean_k t_k.

    The batch each worker would finish in the mean compute time at its measured throughput;
    equivalently b_k - T_k (t_k - t_bar). Slow workers get less, fast ones more.
    """
    same_keys(batches=batches, times_ms=times_ms)
    b = {k: positive(f"batch of {k!r}", v) for k, v in batches.items()}
    t = {k: positive(f"compute time of {k!r}", v) for k, v in times_ms.items()}
    if not t:
        return {}
    mean = math.fsum(v / len(t) for v in t.values())
    return {k: b[k] * (mean / t[k]) for k in b}


def total_preserving(targets: Mapping[str, float], batches: Mapping[str, int]) -> dict[str, float]:
    """Eq. 6 targets rescaled so they sum to the same workers' current total (ASP).

    ASP has no sum rule to pull the total back, and Eq. 6 with the arithmetic-mean time inflates it
    at every step when speeds differ (mean t >= sum b / sum T), compounding (HL8: 128 -> 241).
    Taking t_bar as the cluster's time at its current total instead keeps sum(b) where it is.
    """
    total = math.fsum(targets.values())
    if not targets or total <= 0:
        return dict(targets)
    scale = math.fsum(batches[k] for k in targets) / total
    return {k: v * scale for k, v in targets.items()}


def outside_deadband(current: int, target: float, deadband: float, *, whole: bool = False) -> bool:
    """Eq. 7: True when |target - current| / target >= deadband, i.e. the change is worth making.

    Small corrections are skipped because re-batching costs time (data loader reset, re-sharding)
    and measured times never settle exactly on the mean. With `whole` (batches are whole samples,
    rounded to the nearest) and a target so small that one sample is wider than the deadband
    (target · deadband < 1), the gap no batch can close, |target - round(target)|, is not counted:
    a target between two integers would otherwise be outside the deadband of both, and the worker
    moved back and forth at every decision.
    """
    cur = real("current batch", current)
    tgt = positive("target batch", target)
    band = real("deadband", deadband)
    if not 0.0 <= band < 1.0:
        raise ValueError(f"deadband must be in [0, 1), got {band}")
    unavoidable = abs(tgt - math.floor(tgt + 0.5)) if whole and tgt * band < 1.0 else 0.0
    return (abs(tgt - cur) - unavoidable) / tgt >= band

"""Upper bounds on the magnitude of values, so that no step of the server can overflow fp32.

Pure: no I/O. A pushed value is finite, but sums and steps of finite values can still overflow
(a gradient near 3e38 times its batch size, momentum adding two of them, θ + Δ with both near the
limit). The store keeps a bound on max|value| of its parameters and optimizer state and, before a
step or an update, works out from the incoming values' bound whether any value the step computes
could exceed `LIMIT`; if so the step is refused before anything changes (common/params/store.py, common/params/stepping.py).

A chunk's bound costs about what the NaN/Inf check it replaces cost: the Euclidean norm bounds the
largest value, and for fp32 it is one BLAS dot product. Only when that overflows (values above
~1e19, or NaN/Inf) is the exact maximum taken.
"""

from __future__ import annotations

import math

import torch

from common.transport.chunked import ChunkedVector, Vector, parts

FLOAT32_MAX = float(torch.finfo(torch.float32).max)
LIMIT = FLOAT32_MAX / 4
"""The largest bound any value of a step may reach: the headroom covers fp32 rounding on the way."""
ROUNDING = 1 + 2**-18
"""A bound on the relative growth from rounding over one step's few fp32 operations (each 2^-24)."""
PUSH_MARGIN = 2.0
"""A push is checked as if its values were this many times their bound, so that the round's mean
(within the largest push's bound, up to rounding) always passes the step's own check."""
_FLOAT16_MAX = float(torch.finfo(torch.float16).max)
_NORM_SLACK = {torch.float32: 1 + 2**-10, torch.bfloat16: 1 + 2**-6}  # the norm's own rounding


class OverflowRisk(ValueError):
    """A step or an update whose values could overflow fp32; it was refused and nothing changed."""


def magnitude(values: torch.Tensor) -> float:
    """An upper bound on max|values|, at least as large as the exact one; inf if any is NaN or Inf."""
    if values.numel() == 0:
        return 0.0
    if values.dtype == torch.float16:  # every finite fp16 value is within its range
        return _FLOAT16_MAX if math.isfinite(values.sum().item()) or bool(torch.isfinite(values).all()) else math.inf
    slack = _NORM_SLACK.get(values.dtype)
    if slack is not None:
        norm = math.sqrt(torch.dot(values, values).item()) if values.dtype == torch.float32 else (
            torch.linalg.vector_norm(values).item())
        if math.isfinite(norm):
            return norm * slack
    return exact_magnitude(values)


def exact_magnitude(values: torch.Tensor) -> float:
    """max|values| exactly (inf if any is NaN or Inf); several times the cost of `magnitude`."""
    if values.numel() == 0:
        return 0.0
    low, high = (v.item() for v in torch.aminmax(values))
    if not (math.isfinite(low) and math.isfinite(high)):
        return math.inf
    return max(abs(low), abs(high))


def magnitude_of(vector: Vector) -> float:
    """`magnitude` of a tensor or a ChunkedVector (whose receiver may have measured it already)."""
    if isinstance(vector, ChunkedVector) and vector.bound is not None:
        return vector.bound
    return max((magnitude(part) for _, part in parts(vector)), default=0.0)


def within_limit(*bounds: float) -> bool:
    """Whether every bound is at most LIMIT (False for NaN or Inf)."""
    return all(b <= LIMIT for b in bounds)

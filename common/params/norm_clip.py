"""Robust aggregation: a bound on how far any one push can move the model. Pure: no I/O.

A push is finite and from a member (common.transport.magnitude keeps its step finite), yet one push
of all-1e30 values moves every parameter by about 1e30 x lr / n and the model never recovers. Two
rules, each off unless asked for, bound a push's L2 norm |g| (a BSP gradient, an ASP update):

- `max_norm` X (ps-server --max-update-norm): |g| at most X;
- `outlier_ratio` K (--clip-outliers): |g| at most K times the median norm of the last HISTORY
  pushes, once MIN_HISTORY were seen (before that only X applies). The median moves only with the
  bulk of the pushes: a minority of members cannot raise it.

A push beyond the limit is clipped, g <- g x limit / |g| (as torch.nn.utils.clip_grad_norm_ does),
not refused: its samples still count, so every round keeps Σ b = B and every epoch its samples once,
and an honest worker's rare spike costs a shorter step, not an error that ends it. The history holds
the norms as clipped, so an outlier cannot raise the limit it is measured against.

The cost: one more read of each push (its norm: a dot product per part, widened to float64 only
where fp32 overflows), and a copy of a push that is clipped.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

import torch

from common.params.aggregation import squared_norm
from common.transport.chunked import Vector, parts

HISTORY = 50
"""How many recent pushes' norms the median is taken over."""
MIN_HISTORY = 5
"""Pushes seen before `outlier_ratio` applies (the first rounds' gradients have no median to compare with)."""


@dataclass(frozen=True)
class NormLimits:
    """--max-update-norm (None: off) and --clip-outliers (None: off)."""

    max_norm: float | None = None
    outlier_ratio: float | None = None

    def __post_init__(self) -> None:
        if self.max_norm is not None and not (self.max_norm > 0 and math.isfinite(self.max_norm)):
            raise ValueError(f"--max-update-norm must be > 0 and finite, got {self.max_norm}")
        if self.outlier_ratio is not None and not (self.outlier_ratio >= 1 and math.isfinite(self.outlier_ratio)):
            raise ValueError(f"--clip-outliers must be >= 1 and finite, got {self.outlier_ratio}")

    @property
    def on(self) -> bool:
        return self.max_norm is not None or self.outlier_ratio is not None


class NormClip:
    """The limits and the recent norms they compare with."""

    def __init__(self, limits: NormLimits) -> None:
        self.limits = limits
        self.recent: deque[float] = deque(maxlen=HISTORY)

    def limit(self) -> float | None:
        """The largest norm a push may have now (None: no limit)."""
        bounds = [] if self.limits.max_norm is None else [self.limits.max_norm]
        if self.limits.outlier_ratio is not None and len(self.recent) >= MIN_HISTORY:
            bounds.append(self.limits.outlier_ratio * statistics.median(self.recent))
        return min(bounds, default=None)

    def factor(self, norm: float) -> float:
        """What a push of this norm is scaled by (1: unchanged); its norm, as clipped, joins the history.
        A norm that is not finite is left to the overflow checks (common.transport.magnitude) and not kept."""
        if not math.isfinite(norm):
            return 1.0
        limit = self.limit()
        clipped = norm if limit is None else min(norm, limit)
        self.recent.append(clipped)
        return 1.0 if clipped >= norm else clipped / norm


def vector_norm(vector: Vector) -> float:
    """|v|: an fp32 dot product per part, in float64 where that overflows (or for a bf16/fp16 part)."""
    total = 0.0
    for _, part in parts(vector):
        flat = part.reshape(-1)
        if flat.dtype == torch.float32:
            square = float(torch.dot(flat, flat))
            if math.isfinite(square):
                total += square
                continue
        total += squared_norm(flat)
    return math.sqrt(total)


def scaled(vector: Vector, factor: float) -> torch.Tensor:
    """A new fp32 tensor of `vector` times `factor` (a push's values are views of received bytes: never written)."""
    out = torch.empty(vector.numel(), dtype=torch.float32)
    for start, part in parts(vector):
        torch.mul(part.reshape(-1).float(), factor, out=out[start : start + part.numel()])
    return out

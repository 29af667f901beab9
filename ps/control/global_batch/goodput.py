"""`--adaptive-batch gns`: the global batch B that maximises goodput, and the learning rate at it.

Goodput (Pollux, Cannikin §4) is progress per second: throughput(B), samples per second as the one
model of a round predicts a round of B (ps/control/performance.py), times the statistical efficiency E(B) = (φ + B₀)/(φ + B), the progress a
sample at batch B makes relative to one at the starting batch B₀ (φ the gradient noise scale,
ps/control/global_batch/gns.py). A larger B is faster per sample where a round has fixed costs, and worth less
per sample once B passes φ. `choose` scans B in [lower, upper] and moves only when the best predicted
goodput beats the current one by the threshold (a change costs re-measuring every worker).

The learning rate follows B by one of three rules (`lr_factor`, a factor on the job's schedule):
linear B/B₀ (Goyal et al.), sqrt √(B/B₀) (Krizhevsky), and adascale, AdaScale's gain ratio
r = (B/B₀)·E(B): the LR grows linearly while noise dominates (B ≪ φ) and stops growing once the
signal does (B ≫ φ), the same progress per sample the efficiency counts. Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ps.control.global_batch.gns import statistical_efficiency
from common.number_checks import finite, whole

LR_SCALINGS: tuple[str, ...] = ("adascale", "linear", "sqrt")
"""The `--lr-scaling` rules (the first is the default)."""
STATE_FORMAT = "adaptive-batch/1"
_GRID = 48
"""Candidate batches per decision: a geometric grid over [lower, upper] (plus both ends and B now)."""


@dataclass(frozen=True)
class AdaptiveConfig:
    """The settings of `--adaptive-batch gns`, validated on construction (ValueError naming the flag)."""

    base_batch: int
    min_batch: int
    max_batch: int
    threshold: float = 0.05
    lr_scaling: str = "adascale"

    def __post_init__(self) -> None:
        whole("--global-batch", self.base_batch, 1)
        lo = whole("--min-global-batch", self.min_batch, 1)
        hi = whole("--max-global-batch", self.max_batch, 1)
        if lo > hi:
            raise ValueError(f"--min-global-batch {lo} exceeds --max-global-batch {hi}")
        if not lo <= self.base_batch <= hi:
            raise ValueError(f"--global-batch {self.base_batch} is outside [--min-global-batch {lo}, "
                             f"--max-global-batch {hi}]")
        threshold = finite("--adapt-threshold", self.threshold, 0.0, 1.0, open_high=True)
        if self.lr_scaling not in LR_SCALINGS:
            raise ValueError(f"--lr-scaling must be one of {', '.join(LR_SCALINGS)}, got {self.lr_scaling!r}")
        object.__setattr__(self, "threshold", threshold)


def lr_factor(rule: str, batch: int, base_batch: int, phi: float | None) -> float:
    """The factor on the job's learning rate at batch B (1 at B₀); adascale keeps 1 until φ is known."""
    ratio = batch / base_batch
    if rule == "linear":
        return ratio
    if rule == "sqrt":
        return math.sqrt(ratio)
    if rule == "adascale":
        return 1.0 if phi is None else ratio * statistical_efficiency(phi, batch, base_batch)
    raise ValueError(f"unknown lr scaling rule {rule!r}")


def candidates(lower: int, upper: int, current: int) -> list[int]:
    """The batches a decision compares: a geometric grid over [lower, upper], both ends and `current`."""
    points = {lower, upper, min(max(current, lower), upper)}
    if upper > lower:
        step = (upper / lower) ** (1.0 / (_GRID - 1))
        points.update(min(upper, max(lower, round(lower * step ** i))) for i in range(_GRID))
    return sorted(points)


@dataclass(frozen=True)
class Decision:
    """One decision: the batch chosen (== current when unchanged) and what it was based on."""

    batch: int
    current: int
    changed: bool
    gain: float | None  # predicted goodput(best)/goodput(current) − 1; None: nothing to compare
    phi: float | None
    efficiency: float | None  # E(batch) relative to B₀
    samples_per_s: float | None  # predicted throughput at `batch`
    reason: str

    def record(self) -> dict[str, Any]:
        """Fields for the metrics log's `adapt` record."""
        out = asdict(self)
        for key in ("gain", "phi", "efficiency", "samples_per_s"):
            if out[key] is not None:
                out[key] = round(out[key], 6 if key == "gain" else 3)
        return out


def goodput(throughput: float, phi: float, batch: int, base_batch: int) -> float:
    """Samples per second times the efficiency of a sample at `batch`: B₀-equivalent samples per second."""
    return throughput * statistical_efficiency(phi, batch, base_batch)


def choose(config: AdaptiveConfig, current: int, phi: float | None, lower: int, upper: int,
           round_ms: Callable[[int], float] | None, upward_only: bool = False) -> Decision:
    """The batch to train at next. `lower`/`upper` are the flags' range narrowed to what the workers'
    bounds can make up; `round_ms(B)` the predicted time of a round of B (None: not measured yet).
    Unchanged (with the reason) while φ or the round time is unknown or the gain is below threshold.
    `upward_only`: `round_ms` is performance.measured_round's guess, which overvalues a smaller B (it counts the
    workers' fixed costs as per-sample time) and undervalues a larger one, so only a move up is
    trusted (inside the bounds; a B outside them still moves in)."""
    lo, hi = max(lower, config.min_batch), min(upper, config.max_batch)

    def unchanged(reason: str, gain: float | None = None) -> Decision:
        eff = None if phi is None else statistical_efficiency(phi, current, config.base_batch)
        rate = None
        if round_ms is not None and round_ms(current) > 0:
            rate = current / round_ms(current) * 1000.0
        return Decision(current, current, False, gain, phi, eff, rate, reason)

    if phi is None:
        return unchanged("noise scale not known yet")
    if round_ms is None:
        return unchanged("round time not measured yet")
    if lo > hi:
        return unchanged(f"the workers' bounds allow no batch in [{config.min_batch}, {config.max_batch}]")

    def value(b: int) -> float:
        t = round_ms(b)
        return goodput(b / t * 1000.0, phi, b, config.base_batch) if t > 0 else 0.0

    now = value(current)
    inside = lo <= current <= hi
    pool = [b for b in candidates(lo, hi, current) if b >= current or not (upward_only and inside)]
    best = max(pool, key=lambda b: (value(b), -abs(b - current)))
    gain = value(best) / now - 1.0 if now > 0 else None
    if best == current or (inside and (gain is None or gain < config.threshold)):
        return unchanged("gain below --adapt-threshold" if best != current else "the current batch is best", gain)
    t = round_ms(best)
    return Decision(best, current, True, gain, phi, statistical_efficiency(phi, best, config.base_batch),
                    best / t * 1000.0 if t > 0 else None, "goodput" if inside else "outside the bounds")


class AdaptiveBatch:
    """The decision's state: B now, φ at the last decision, the decisions taken and their changes."""

    def __init__(self, config: AdaptiveConfig) -> None:
        self.config = config
        self.batch = config.base_batch
        self.phi: float | None = None
        self.decisions = 0
        self.changes = 0
        self.last: Decision | None = None

    def choose(self, phi: float | None, lower: int, upper: int, round_ms: Callable[[int], float] | None,
               upward_only: bool = False) -> Decision:
        """One decision at the current batch (counted; φ kept for the LR rule); `apply` it once the
        caller has re-split the new B."""
        decision = choose(self.config, self.batch, phi, lower, upper, round_ms, upward_only)
        self.phi = phi if phi is not None else self.phi
        self.decisions += 1
        self.last = decision
        return decision

    def apply(self, decision: Decision) -> None:
        """The decision's batch is now B."""
        if decision.changed and decision.batch != self.batch:
            self.batch = decision.batch
            self.changes += 1

    def lr_factor(self) -> float:
        """The factor on the job's learning rate at the current batch."""
        return lr_factor(self.config.lr_scaling, self.batch, self.config.base_batch, self.phi)

    def efficiency(self) -> float | None:
        """E(B) of the current batch (None while φ is unknown)."""
        return None if self.phi is None else statistical_efficiency(self.phi, self.batch, self.config.base_batch)

    def state_dict(self) -> dict[str, Any]:
        return {"format": STATE_FORMAT, "base_batch": self.config.base_batch, "batch": self.batch, "phi": self.phi,
                "decisions": self.decisions, "changes": self.changes}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take a checkpoint's state (ValueError, nothing changed, on a malformed one or another B₀)."""
        if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"adaptive-batch state must be a mapping of format {STATE_FORMAT!r}")
        if state.get("base_batch") != self.config.base_batch:
            raise ValueError(f"the checkpoint started at --global-batch {state.get('base_batch')!r}, "
                             f"not {self.config.base_batch}")
        batch = whole("adaptive batch", state.get("batch"), 1)
        phi = state.get("phi")
        phi = None if phi is None else finite("phi", phi, 0.0)
        decisions = whole("decisions", state.get("decisions"), 0)
        changes = whole("changes", state.get("changes"), 0)
        self.batch, self.phi, self.decisions, self.changes = batch, phi, decisions, changes

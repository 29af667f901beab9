"""How the global batch B is shared out over a policy's workers: the weights a plan starts from (equal,
or the declared cores) or that the measurements give (the throughputs), and their split within each
worker's bounds with the exact sum (OmniLearn Eq. 8) wherever the bounds allow it. Pure."""

from __future__ import annotations

import math
from collections.abc import Mapping

from ps.control.config import PolicyConfig
from ps.control.split import clip, fit_to_sum, largest_remainder
from ps.control.worker_record import Worker


def bounds(workers: Mapping[str, Worker]) -> tuple[dict[str, int], dict[str, int]]:
    """Per-worker lower and upper batch bounds."""
    return {k: w.min_batch for k, w in workers.items()}, {k: w.max_batch for k, w in workers.items()}


def opening_weights(workers: Mapping[str, Worker], config: PolicyConfig) -> dict[str, float]:
    """The first plan's weights: equal, or the declared cores (`dynamic_start` static)."""
    if config.dynamic_start == "uniform":
        return {k: 1.0 for k in workers}
    return {k: w.cores for k, w in workers.items()}


def measured_weights(workers: Mapping[str, Worker], config: PolicyConfig) -> dict[str, float]:
    """The workers' measured throughputs where known, the others estimated from the opening weights
    on the measured workers' scale; the opening weights when nobody is measured."""
    opening = opening_weights(workers, config)
    known = {k: w.throughput for k, w in workers.items() if w.throughput is not None}
    if not known:
        return opening
    top_known, top_opening = max(known.values()), max(opening.values())
    measured = {k: v / top_known for k, v in known.items()}
    guessed = {k: v / top_opening for k, v in opening.items()}
    # Put the unmeasured workers on the measured workers' throughput scale, per unit of opening weight.
    # Declared cores may be any positive float: the measured workers' share of them can underflow to 0
    # (5e-324 cores beside 1e6), and then no scale can be read from them.
    scale = math.fsum(guessed[k] for k in known)
    if not scale > 0:
        return opening
    per_unit = math.fsum(measured.values()) / scale
    weights = {k: measured[k] if k in known else guessed[k] * per_unit for k in workers}
    if all(0.0 < v < math.inf for v in weights.values()):
        return weights
    return opening


def exact_sum(workers: Mapping[str, Worker], config: PolicyConfig) -> bool:
    """Whether plans sum exactly to B: always with `keep_global_sum` (BSP), and in ASP whenever the
    workers' bounds allow it (their min_batch sum to at most B, their max_batch to at least B)."""
    if config.keep_global_sum:
        return True
    lower, upper = bounds(workers)
    return sum(lower.values()) <= config.global_batch <= sum(upper.values())


def check_reachable(workers: Mapping[str, Worker], config: PolicyConfig) -> None:
    """Raise ValueError if the workers' max_batch cannot add up to B."""
    ceiling = sum(w.max_batch for w in workers.values())
    if ceiling < config.global_batch:
        raise ValueError(
            f"the workers' max_batch sum to {ceiling} < global_batch {config.global_batch}; "
            "add workers, raise max_batch or lower global_batch"
        )


def split_batch(workers: Mapping[str, Worker], config: PolicyConfig, weights: Mapping[str, float],
                for_time: bool) -> dict[str, int]:
    """Split B by `weights` within each worker's bounds with an exact sum; without `keep_global_sum`
    (ASP) round and clip instead when the bounds cannot meet B. `for_time`: a unit is a micro-batch,
    rounded for the shortest round (split.fit_to_sum)."""
    lower, upper = bounds(workers)
    if not exact_sum(workers, config):
        shares = largest_remainder(weights, config.global_batch)
        return {k: clip(b, lower[k], upper[k]) for k, b in shares.items()}
    check_reachable(workers, config)
    return fit_to_sum(weights, config.global_batch, lower, upper, for_time)


def global_batch_range(workers: Mapping[str, Worker], config: PolicyConfig) -> tuple[int, int | None]:
    """The global batches the workers' bounds can make up: [Σ min_batch, Σ max_batch], the upper end
    None where a worker's bound is the default (it follows B)."""
    default = config.default_max_batch if config.max_batch is None else None
    lower = sum(w.min_batch for w in workers.values())
    if any(w.max_batch == default for w in workers.values()):
        return lower, None
    return lower, sum(w.max_batch for w in workers.values())

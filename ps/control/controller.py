"""Batch controller: per-worker batch sizes from measured compute times (design.md section 5).

A pure state machine: the server tells it who joined or left and how long each worker took to compute
its batch, and asks it for batch sizes. It has no I/O, no clock and no transport, so every rule
(Eq. 4a static split, Eq. 6 proportional control, Eq. 7 deadband, Eq. 8 exact global batch) can be
unit- and property-tested in isolation.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

Policy = Literal["uniform", "static", "dynamic"]
StartPolicy = Literal["uniform", "static"]

STATE_VERSION = 1
"""Format version written by `BatchController.state_dict` and required by `from_state_dict`."""

_POLICIES: tuple[str, ...] = ("uniform", "static", "dynamic")
_STARTS: tuple[str, ...] = ("uniform", "static")
_WORKER_KEYS = frozenset({"id", "cores", "min_batch", "max_batch", "batch", "ewma_ms", "throughput"})
_OPTIONAL_WORKER_KEYS = frozenset({"samples"})  # absent from states written before it was kept
_STATE_KEYS = frozenset({"version", "config", "workers", "adjustments"})


def _int(name: str, value: Any, minimum: int | None = None) -> int:
    """Return `value` as an int, or raise ValueError naming `name` (bools are not integers here)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    result = int(value)
    if minimum is not None and result < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {result}")
    return result


def _real(name: str, value: Any) -> float:
    """Return `value` as a finite float, or raise ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    result = float(value)
    if not math.isfinite(result):
        raise ValueError(f"{name} must be finite, got {result}")
    return result


def _positive(name: str, value: Any) -> float:
    """Return `value` as a finite float > 0, or raise ValueError naming `name`."""
    result = _real(name, value)
    if result <= 0:
        raise ValueError(f"{name} must be > 0, got {result}")
    return result


def _same_keys(**maps: Mapping[str, Any]) -> None:
    """Raise ValueError unless all mappings have the same keys (the per-worker inputs must line up)."""
    names = list(maps)
    first = set(maps[names[0]])
    for name in names[1:]:
        if set(maps[name]) != first:
            raise ValueError(f"{names[0]} and {name} must have the same worker ids")


def _clip(value: int, lower: int, upper: int) -> int:
    """Clamp `value` to [lower, upper]."""
    return max(lower, min(upper, value))


def _round_half_up(value: float) -> int:
    """Round to the nearest integer, halves up (Python's round() goes to even, which is surprising here)."""
    return math.floor(value + 0.5)


def _round_to_sum(
    exact: Mapping[str, float], total: int, lower: Mapping[str, int], upper: Mapping[str, int]
) -> dict[str, int]:
    """Round `exact` (already within bounds, summing to about `total`) to integers summing to `total`.

    Floors first, then hands the missing units to the largest fractional parts (ties: first key
    first), never past a bound; the reverse if flooring overshot, which only float error can cause.
    Requires sum(lower) <= total <= sum(upper).
    """
    result = {k: _clip(math.floor(x), lower[k], upper[k]) for k, x in exact.items()}
    left = total - sum(result.values())
    while left > 0:
        k = max((k for k in result if result[k] < upper[k]), key=lambda k: exact[k] - result[k])
        result[k] += 1
        left -= 1
    while left < 0:
        k = min((k for k in result if result[k] > lower[k]), key=lambda k: exact[k] - result[k])
        result[k] -= 1
        left += 1
    return result


def largest_remainder(weights: Mapping[str, float], total: int) -> dict[str, int]:
    """Split `total` into non-negative integers proportional to `weights`, summing exactly to `total`.

    Hamilton's method: floor every exact share, give the units left over to the largest fractional
    parts (ties go to the first key), so each share is less than one unit from its exact value.
    """
    total = _int("total", total, minimum=0)
    w = {k: _real(f"weight of {k!r}", v) for k, v in weights.items()}
    if any(v < 0 for v in w.values()):
        raise ValueError("weights must be >= 0")
    if total == 0:
        return {k: 0 for k in w}
    top = max(w.values(), default=0.0)
    if top <= 0:
        raise ValueError(f"cannot split total {total}: no positive weight")
    norm = {k: v / top for k, v in w.items()}
    mass = math.fsum(norm.values())
    exact = {k: v / mass * total for k, v in norm.items()}
    return _round_to_sum(exact, total, {k: 0 for k in w}, {k: total for k in w})


def fit_to_sum(
    targets: Mapping[str, float], total: int, lower: Mapping[str, int], upper: Mapping[str, int]
) -> dict[str, int]:
    """Integers proportional to `targets`, within [lower, upper] per key, summing exactly to `total`.

    Water-filling: scale the free keys so they fill what is left of `total`; if clipping to the
    bounds then overshoots, pin the keys clipped at their lower bound (they stay there at any smaller
    scale), if it undershoots pin the ones clipped at their upper bound, and redistribute over the
    rest; repeat (at most one round per key). The result is clip(s * target, lower, upper) with one
    common scale s, rounded by largest remainders within the bounds (Eq. 8 without OmniLearn's
    equal-subtraction bias). Raises ValueError if the bounds cannot meet `total`.
    """
    exact, lo, hi = _water_fill(targets, total, lower, upper)
    return _round_to_sum(exact, total, lo, hi)


def _water_fill(
    targets: Mapping[str, float], total: int, lower: Mapping[str, int], upper: Mapping[str, int]
) -> tuple[dict[str, float], dict[str, int], dict[str, int]]:
    """Validate the inputs of `fit_to_sum` and return its real-valued solution with the integer bounds."""
    _same_keys(targets=targets, lower=lower, upper=upper)
    total = _int("total", total)
    lo = {k: _int(f"lower bound of {k!r}", lower[k]) for k in targets}
    hi = {k: _int(f"upper bound of {k!r}", upper[k]) for k in targets}
    for k in targets:
        if lo[k] > hi[k]:
            raise ValueError(f"lower bound {lo[k]} of {k!r} exceeds its upper bound {hi[k]}")
    t = {k: _positive(f"target of {k!r}", v) for k, v in targets.items()}
    if sum(lo.values()) > total:
        raise ValueError(f"infeasible: lower bounds sum to {sum(lo.values())} > total {total}")
    if sum(hi.values()) < total:
        raise ValueError(f"infeasible: upper bounds sum to {sum(hi.values())} < total {total}")
    if not t:
        return {}, lo, hi
    top = max(t.values())
    t = {k: v / top for k, v in t.items()}

    pinned: dict[str, float] = {}
    free = list(t)
    scaled: dict[str, float] = {}
    while free:
        rest = total - math.fsum(pinned.values())
        level = rest / math.fsum(t[k] for k in free)
        scaled = {k: level * t[k] for k in free}
        below = [k for k in free if scaled[k] < lo[k]]
        above = [k for k in free if scaled[k] > hi[k]]
        if not below and not above:
            break
        clipped = {k: min(hi[k], max(lo[k], x)) for k, x in scaled.items()}
        excess = math.fsum(clipped.values()) - rest
        if abs(excess) <= 1e-9 * max(1.0, abs(rest)):
            scaled = clipped
            break
        pin = below if excess > 0 else above
        for k in pin or below + above:
            pinned[k] = clipped[k]
        free = [k for k in free if k not in pinned]
        scaled = {}
    return {k: pinned[k] if k in pinned else scaled[k] for k in t}, lo, hi


def proportional_targets(batches: Mapping[str, int], times_ms: Mapping[str, float]) -> dict[str, float]:
    """Eq. 6: target b_k' = T_k * t_bar with throughput T_k = b_k / t_k and t_bar = mean_k t_k.

    The batch each worker would finish in the mean compute time at its measured throughput;
    equivalently b_k - T_k (t_k - t_bar). Slow workers get less, fast ones more.
    """
    _same_keys(batches=batches, times_ms=times_ms)
    b = {k: _positive(f"batch of {k!r}", v) for k, v in batches.items()}
    t = {k: _positive(f"compute time of {k!r}", v) for k, v in times_ms.items()}
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


def outside_deadband(current: int, target: float, deadband: float) -> bool:
    """Eq. 7: True when |target - current| / target >= deadband, i.e. the change is worth making.

    Small corrections are skipped because re-batching costs time (data loader reset, re-sharding)
    and measured times never settle exactly on the mean.
    """
    cur = _real("current batch", current)
    tgt = _positive("target batch", target)
    band = _real("deadband", deadband)
    if not 0.0 <= band < 1.0:
        raise ValueError(f"deadband must be in [0, 1), got {band}")
    return abs(tgt - cur) / tgt >= band


@dataclass(frozen=True)
class ControllerConfig:
    """Settings of a `BatchController`; validated (and numbers normalised) on construction."""

    policy: Policy = "dynamic"
    global_batch: int = 128
    deadband: float = 0.1
    min_batch: int = 1
    max_batch: int | None = None
    ewma_alpha: float = 0.3
    keep_global_sum: bool = True
    dynamic_start: StartPolicy = "uniform"
    min_samples: int = 3
    """Observations at a worker's current batch before the dynamic policy uses its time (moves it or
    counts it in t_bar): one noisy sample right after a batch change is no basis for a decision."""

    def __post_init__(self) -> None:
        """Reject settings the controller cannot honour, with a message saying what to change."""
        if self.policy not in _POLICIES:
            raise ValueError(f"policy must be one of {', '.join(_POLICIES)}; got {self.policy!r}")
        if self.dynamic_start not in _STARTS:
            raise ValueError(f"dynamic_start must be one of {', '.join(_STARTS)}; got {self.dynamic_start!r}")
        if not isinstance(self.keep_global_sum, bool):
            raise ValueError(f"keep_global_sum must be True (BSP) or False (ASP), got {self.keep_global_sum!r}")
        global_batch = _int("global_batch", self.global_batch, minimum=1)
        min_batch = _int("min_batch", self.min_batch, minimum=1)
        if min_batch > global_batch:
            raise ValueError(f"min_batch {min_batch} exceeds global_batch {global_batch}; lower min_batch")
        max_batch: int | None = None
        if self.max_batch is not None:
            max_batch = _int("max_batch", self.max_batch, minimum=1)
            if max_batch < min_batch:
                raise ValueError(f"max_batch {max_batch} is below min_batch {min_batch}; raise max_batch or use None")
        deadband = _real("deadband", self.deadband)
        if not 0.0 <= deadband < 1.0:
            raise ValueError(f"deadband must be in [0, 1) (a fraction of the target batch), got {deadband}")
        alpha = _real("ewma_alpha", self.ewma_alpha)
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"ewma_alpha must be in (0, 1] (1 = newest observation only), got {alpha}")
        min_samples = _int("min_samples", self.min_samples, minimum=1)
        for name, value in (
            ("global_batch", global_batch),
            ("min_batch", min_batch),
            ("max_batch", max_batch),
            ("deadband", deadband),
            ("ewma_alpha", alpha),
            ("min_samples", min_samples),
        ):
            object.__setattr__(self, name, value)

    @property
    def default_max_batch(self) -> int:
        """Per-worker upper bound used when a worker declares none."""
        return self.global_batch if self.max_batch is None else self.max_batch


def config_changes(before: ControllerConfig, after: ControllerConfig) -> dict[str, tuple[Any, Any]]:
    """The settings that differ between two configs: {field: (before, after)}, in field order."""
    old, new = asdict(before), asdict(after)
    return {name: (old[name], value) for name, value in new.items() if old[name] != value}


@dataclass
class _Worker:
    """Controller-side record of one worker.

    `throughput` (samples per ms at the latest observation) survives batch changes, unlike the
    EWMA, so that a replan after a membership change can still use it. `samples` counts the
    observations since the batch last changed.
    """

    cores: float
    min_batch: int
    max_batch: int
    batch: int | None = None
    ewma_ms: float | None = None
    throughput: float | None = None
    samples: int = 0


class BatchController:
    """Plans per-worker batch sizes and corrects them from observed compute times (OmniLearn-style).

    Usage: `add_worker`/`remove_worker` on membership changes, then `replan`; `observe` every push;
    `adjust` at the chosen granularity (e.g. each epoch). Every plan sums exactly to `global_batch`;
    without `keep_global_sum` (ASP) only where the bounds allow it, and B out of their reach is no error.
    """

    def __init__(self, config: ControllerConfig) -> None:
        if not isinstance(config, ControllerConfig):
            raise ValueError(f"config must be a ControllerConfig, got {type(config).__name__}")
        self._config = config
        self._workers: dict[str, _Worker] = {}
        self._adjustments = 0

    @property
    def config(self) -> ControllerConfig:
        """The (immutable) settings."""
        return self._config

    @property
    def adjustments(self) -> int:
        """Number of `adjust` calls that changed the plan."""
        return self._adjustments

    def workers(self) -> list[str]:
        """Current worker ids, in the order they were added."""
        return list(self._workers)

    def add_worker(
        self, worker_id: str, cores: float = 1.0, min_batch: int | None = None, max_batch: int | None = None
    ) -> None:
        """Register a worker with its declared resources (Eq. 4a) and optional own batch bounds.

        The worker gets a batch at the next `replan`. Raises ValueError (nothing changes) on a
        duplicate id, cores <= 0, min > max, or, with `keep_global_sum`, if the workers' minimum
        batches would exceed the global batch.
        """
        if not isinstance(worker_id, str) or not worker_id:
            raise ValueError(f"worker_id must be a non-empty string, got {worker_id!r}")
        if worker_id in self._workers:
            raise ValueError(f"worker {worker_id!r} is already registered; remove it first or use another id")
        c = _positive(f"cores of {worker_id!r}", cores)
        cfg = self._config
        lo = cfg.min_batch if min_batch is None else _int(f"min_batch of {worker_id!r}", min_batch, minimum=1)
        hi = cfg.default_max_batch if max_batch is None else _int(f"max_batch of {worker_id!r}", max_batch, minimum=1)
        if lo > hi:
            raise ValueError(f"worker {worker_id!r}: min_batch {lo} exceeds max_batch {hi}")
        if cfg.keep_global_sum and self._floor_sum(lo) > cfg.global_batch:
            raise ValueError(
                f"cannot add {worker_id!r}: the workers' min_batch would sum to {self._floor_sum(lo)} > global_batch "
                f"{cfg.global_batch}; lower min_batch or raise global_batch"
            )
        self._workers[worker_id] = _Worker(cores=c, min_batch=lo, max_batch=hi)

    def can_add(self, count: int = 1) -> bool:
        """Whether `count` more workers with the default min_batch fit: with `keep_global_sum` every
        worker needs at least its min_batch of the global batch."""
        cfg = self._config
        return not cfg.keep_global_sum or self._floor_sum(count * cfg.min_batch) <= cfg.global_batch

    def _floor_sum(self, extra: int) -> int:
        """The registered workers' min_batch summed, plus `extra`."""
        return extra + sum(w.min_batch for w in self._workers.values())

    def remove_worker(self, worker_id: str) -> None:
        """Forget a worker (left or failed); call `replan` to re-split its share of B."""
        if worker_id not in self._workers:
            raise ValueError(f"unknown worker {worker_id!r}")
        del self._workers[worker_id]

    def replan(self) -> dict[str, int]:
        """Build the plan over the current workers and return it.

        uniform: equal split; static: Eq. 4a, b_k proportional to cores; dynamic: the workers'
        measured throughputs where known (a worker without one is estimated by `dynamic_start`
        relative to the measured ones), else `dynamic_start`. The split of B is fitted to the bounds
        with an exact sum (ASP whose bounds cannot meet B: rounded and clipped). Raises ValueError, changing nothing,
        if the workers' max_batch cannot reach B under `keep_global_sum`.
        """
        if not self._workers:
            return {}
        self._apply(self._split(self._plan_weights()))
        return self.plan()

    def plan(self) -> dict[str, int]:
        """Current batch size of every planned worker (a copy)."""
        return {k: w.batch for k, w in self._workers.items() if w.batch is not None}

    def observe(self, worker_id: str, batch: int, compute_ms: float) -> None:
        """Feed one compute-time measurement (fetch + forward + backward) into the worker's EWMA.

        Ignored when `batch` is not the worker's planned batch: it was computed under an older plan.
        Raises ValueError, changing nothing, on an unknown worker, batch <= 0 or a time that is not
        finite and >= 0.
        """
        if worker_id not in self._workers:
            raise ValueError(f"unknown worker {worker_id!r}")
        b = _int("batch", batch, minimum=1)
        ms = _real("compute_ms", compute_ms)
        if ms < 0:
            raise ValueError(f"compute_ms must be >= 0, got {ms}")
        w = self._workers[worker_id]
        if w.batch is None or b != w.batch:
            return
        alpha = self._config.ewma_alpha
        w.ewma_ms = ms if w.ewma_ms is None else alpha * ms + (1.0 - alpha) * w.ewma_ms
        w.samples += 1
        throughput = b / w.ewma_ms if w.ewma_ms > 0 else math.inf
        if math.isfinite(throughput):
            w.throughput = throughput

    def smoothed_ms(self) -> dict[str, float | None]:
        """EWMA compute time per worker at its current batch (None: no observation since it changed)."""
        return {k: w.ewma_ms for k, w in self._workers.items()}

    def adjust(self) -> dict[str, int]:
        """Make one controller decision and return the (possibly unchanged) plan.

        uniform/static: no change. dynamic: Eq. 6 targets from the smoothed times of the measured
        workers (those with `min_samples` observations at their current batch; the others keep their
        batch and stay out of t_bar); nothing moves unless some worker is outside the Eq. 7 deadband.
        ASP whose bounds cannot meet B: the movers' targets are rounded and clipped to the bounds.
        Otherwise (BSP, and ASP within its bounds) the movers
        are fitted to what the held workers leave of B; if that cannot bring every mover within the
        deadband of its target (the movers all want to move the same way, a bound binds, or the
        plan no longer sums to B after a removal), all measured workers are fitted to what the
        unmeasured ones leave of B instead (everyone, if bounds forbid that), so the sum rule cannot
        freeze an imbalance. Current batches that already are a rounding of that fit are kept.
        Raises ValueError if a worker has no batch yet (call `replan` after `add_worker`).
        """
        unplanned = [k for k, w in self._workers.items() if w.batch is None]
        if unplanned:
            raise ValueError(f"workers {unplanned} have no batch yet; call replan() after add_worker()")
        if self._config.policy != "dynamic" or not self._workers:
            return self.plan()
        if self._apply(self._dynamic_step()):
            self._adjustments += 1
        return self.plan()

    def state_dict(self) -> dict[str, Any]:
        """Full state as plain JSON-serialisable data (for checkpoints)."""
        return {
            "version": STATE_VERSION,
            "config": asdict(self._config),
            "workers": [
                {
                    "id": k,
                    "cores": w.cores,
                    "min_batch": w.min_batch,
                    "max_batch": w.max_batch,
                    "batch": w.batch,
                    "ewma_ms": w.ewma_ms,
                    "throughput": w.throughput,
                    "samples": w.samples,
                }
                for k, w in self._workers.items()
            ],
            "adjustments": self._adjustments,
        }

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> BatchController:
        """Rebuild a controller from `state_dict` output; raises ValueError on malformed or inconsistent state."""
        if not isinstance(state, Mapping):
            raise ValueError(f"controller state must be a mapping, got {type(state).__name__}")
        if set(state) != _STATE_KEYS:
            raise ValueError(f"controller state must have exactly the keys {sorted(_STATE_KEYS)}, got {sorted(state)}")
        if state["version"] != STATE_VERSION:
            raise ValueError(f"unsupported controller state version {state['version']!r} (expected {STATE_VERSION})")
        raw_config = state["config"]
        if not isinstance(raw_config, Mapping):
            raise ValueError("controller state 'config' must be a mapping")
        try:
            config = ControllerConfig(**raw_config)
        except TypeError as exc:
            raise ValueError(f"bad controller config in state: {exc}") from None
        ctl = cls(config)
        entries = state["workers"]
        if not isinstance(entries, list):
            raise ValueError("controller state 'workers' must be a list")
        for entry in entries:
            if not isinstance(entry, Mapping) or not _WORKER_KEYS <= set(entry) <= _WORKER_KEYS | _OPTIONAL_WORKER_KEYS:
                raise ValueError(f"each worker entry must have exactly the keys {sorted(_WORKER_KEYS)} "
                                 f"(and optionally {sorted(_OPTIONAL_WORKER_KEYS)})")
            wid = entry["id"]
            ctl.add_worker(wid, entry["cores"], entry["min_batch"], entry["max_batch"])
            # a state from before `samples` was kept: its smoothed times count as settled
            samples = entry.get("samples", config.min_samples if entry["ewma_ms"] is not None else 0)
            ctl._restore_worker(wid, entry["batch"], entry["ewma_ms"], entry["throughput"], samples)
        if config.keep_global_sum:
            planned = sum(ctl.plan().values())
            if planned > config.global_batch:
                raise ValueError(f"planned batches sum to {planned} > global_batch {config.global_batch}")
        ctl._adjustments = _int("adjustments", state["adjustments"], minimum=0)
        return ctl

    def with_config(self, config: ControllerConfig) -> BatchController:
        """A new controller over the same workers under `config` (a resume with other settings).

        Each worker keeps its cores and measurements (batch, smoothed time, throughput), and the
        adjustment count carries over; a bound equal to the old config's default (so taken from it)
        becomes `config`'s, one given per worker stays. The plan is kept only where it still is one
        of `config`'s: dynamic before and after, the same global batch and sum rule, every batch
        within its new bounds. Otherwise B is re-split by `replan` (under dynamic, from the measured
        throughputs). `config` equal to this one's gives a copy. Raises ValueError if the workers'
        bounds cannot meet `config`'s global batch.
        """
        old = self._config
        ctl = BatchController(config)
        ctl._adjustments = self._adjustments
        same_job = (old.global_batch, old.keep_global_sum) == (config.global_batch, config.keep_global_sum)
        replan = config != old and not (same_job and old.policy == config.policy == "dynamic")
        for wid, w in self._workers.items():
            lower = None if w.min_batch == old.min_batch else w.min_batch
            upper = None if w.max_batch == old.default_max_batch else w.max_batch
            ctl.add_worker(wid, w.cores, lower, upper)
            new = ctl._workers[wid]
            new.throughput = w.throughput
            if w.batch is not None and new.min_batch <= w.batch <= new.max_batch:
                new.batch, new.ewma_ms, new.samples = w.batch, w.ewma_ms, w.samples
            elif w.batch is not None:
                replan = True
        if replan:
            ctl.replan()
        return ctl

    def _restore_worker(self, worker_id: str, batch: Any, ewma_ms: Any, throughput: Any, samples: Any) -> None:
        """Validate and set the dynamic part of a worker record read from a state dict."""
        w = self._workers[worker_id]
        if batch is not None:
            w.batch = _int(f"batch of {worker_id!r}", batch)
            if not w.min_batch <= w.batch <= w.max_batch:
                raise ValueError(f"batch {w.batch} of {worker_id!r} is outside [{w.min_batch}, {w.max_batch}]")
        if ewma_ms is not None:
            if batch is None:
                raise ValueError(f"worker {worker_id!r} has a smoothed time but no batch")
            w.ewma_ms = _real(f"ewma_ms of {worker_id!r}", ewma_ms)
            if w.ewma_ms < 0:
                raise ValueError(f"ewma_ms of {worker_id!r} must be >= 0, got {w.ewma_ms}")
        if throughput is not None:
            w.throughput = _positive(f"throughput of {worker_id!r}", throughput)
        w.samples = _int(f"samples of {worker_id!r}", samples, minimum=0)
        if w.samples and w.ewma_ms is None:
            raise ValueError(f"worker {worker_id!r} has {w.samples} samples but no smoothed time")

    def _bounds(self) -> tuple[dict[str, int], dict[str, int]]:
        """Per-worker lower and upper batch bounds."""
        return (
            {k: w.min_batch for k, w in self._workers.items()},
            {k: w.max_batch for k, w in self._workers.items()},
        )

    def _plan_weights(self) -> dict[str, float]:
        """Relative share of B per worker for `replan`."""
        policy = self._config.policy
        if policy == "uniform" or (policy == "dynamic" and self._config.dynamic_start == "uniform"):
            opening = {k: 1.0 for k in self._workers}
        else:
            opening = {k: w.cores for k, w in self._workers.items()}
        known = {k: w.throughput for k, w in self._workers.items() if w.throughput is not None}
        if policy != "dynamic" or not known:
            return opening
        top_known, top_opening = max(known.values()), max(opening.values())
        measured = {k: v / top_known for k, v in known.items()}
        guessed = {k: v / top_opening for k, v in opening.items()}
        # Put the unmeasured workers on the measured workers' throughput scale, per unit of opening weight.
        per_unit = math.fsum(measured.values()) / math.fsum(guessed[k] for k in known)
        weights = {k: measured[k] if k in known else guessed[k] * per_unit for k in self._workers}
        if all(0.0 < v < math.inf for v in weights.values()):
            return weights
        return opening

    def _split(self, weights: Mapping[str, float]) -> dict[str, int]:
        """Split B by `weights` within each worker's bounds with an exact sum; without `keep_global_sum`
        (ASP) round and clip instead when the bounds cannot meet B."""
        cfg = self._config
        lower, upper = self._bounds()
        if not self._exact_sum():
            shares = largest_remainder(weights, cfg.global_batch)
            return {k: _clip(b, lower[k], upper[k]) for k, b in shares.items()}
        self._check_reachable()
        return fit_to_sum(weights, cfg.global_batch, lower, upper)

    def _exact_sum(self) -> bool:
        """Whether plans sum exactly to B: always with `keep_global_sum` (BSP), and in ASP whenever the
        workers' bounds allow it (their min_batch sum to at most B, their max_batch to at least B)."""
        if self._config.keep_global_sum:
            return True
        lower, upper = self._bounds()
        return sum(lower.values()) <= self._config.global_batch <= sum(upper.values())

    def _check_reachable(self) -> None:
        """Raise ValueError if the workers' max_batch cannot add up to B."""
        ceiling = sum(w.max_batch for w in self._workers.values())
        if ceiling < self._config.global_batch:
            raise ValueError(
                f"the workers' max_batch sum to {ceiling} < global_batch {self._config.global_batch}; "
                "add workers, raise max_batch or lower global_batch"
            )

    def _dynamic_step(self) -> dict[str, int]:
        """Next plan under Eq. 6-8 (see `adjust`)."""
        cfg = self._config
        current = {k: w.batch for k, w in self._workers.items() if w.batch is not None}
        times = {k: w.ewma_ms for k, w in self._workers.items()
                 if w.ewma_ms is not None and w.ewma_ms > 0 and w.samples >= cfg.min_samples}
        targets = proportional_targets({k: current[k] for k in times}, times)
        targets = {k: v for k, v in targets.items() if math.isfinite(v)}
        if not cfg.keep_global_sum:
            targets = total_preserving(targets, current)
        movers = [k for k, t in targets.items() if outside_deadband(current[k], t, cfg.deadband)]
        if not self._exact_sum():
            lower, upper = self._bounds()
            moved = {k: _clip(_round_half_up(targets[k]), lower[k], upper[k]) for k in movers}
            return {**current, **moved}
        held_sum = sum(b for k, b in current.items() if k not in movers)
        fitted = self._fit_subset({k: targets[k] for k in movers}, cfg.global_batch - held_sum, current)
        if fitted is not None and not any(outside_deadband(fitted[k], targets[k], cfg.deadband) for k in movers):
            return {**current, **fitted}
        if not movers and held_sum == cfg.global_batch:
            return current
        unmeasured_sum = sum(b for k, b in current.items() if k not in targets)
        fitted = self._fit_subset(targets, cfg.global_batch - unmeasured_sum, current)
        if fitted is not None:
            return {**current, **fitted}
        self._check_reachable()
        lower, upper = self._bounds()
        wanted = {k: targets.get(k, float(b)) for k, b in current.items()}
        return fit_to_sum(wanted, cfg.global_batch, lower, upper)

    def _fit_subset(
        self, targets: Mapping[str, float], total: int, current: Mapping[str, int]
    ) -> dict[str, int] | None:
        """`fit_to_sum` over the workers in `targets`; None if there are none or their bounds cannot meet `total`.

        Sticky rounding: if the `current` batches already are a rounding of the real-valued fit (each
        less than one sample from it, same sum), they are kept. Otherwise float noise in near-tied
        remainders could pass the odd sample back and forth between equally fast workers forever.
        """
        if not targets:
            return None
        lower = {k: self._workers[k].min_batch for k in targets}
        upper = {k: self._workers[k].max_batch for k in targets}
        if not sum(lower.values()) <= total <= sum(upper.values()):
            return None
        exact, lo, hi = _water_fill(targets, total, lower, upper)
        kept = {k: current[k] for k in targets}
        if sum(kept.values()) == total and all(abs(b - exact[k]) < 1.0 for k, b in kept.items()):
            return kept
        return _round_to_sum(exact, total, lo, hi)

    def _apply(self, new_plan: Mapping[str, int]) -> bool:
        """Install `new_plan`; a worker whose batch changes restarts its EWMA and its sample count (the
        policy waits for `min_samples` observations at the new batch). Returns whether anything changed."""
        changed = False
        for k, b in new_plan.items():
            w = self._workers[k]
            if w.batch != b:
                w.batch = b
                w.ewma_ms = None
                w.samples = 0
                changed = True
        return changed

"""Batch controller: per-worker batch sizes from measured compute times (design.md section 5).

A pure state machine: the server tells it who joined or left and how long each worker took to compute
its batch, and asks it for batch sizes. It has no I/O, no clock and no transport, so every rule
(Eq. 4a static split, Eq. 6 proportional control, Eq. 7 deadband, Eq. 8 exact global batch) can be
unit- and property-tested in isolation. The rules are in split.py and proportional.py; its settings in
config.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ps.control.checks import integer, positive, real
from ps.control.config import ControllerConfig
from ps.control.proportional import outside_deadband, proportional_targets, total_preserving
from ps.control.split import clip, fit_to_sum, largest_remainder, round_half_up, round_to_sum, water_fill

STATE_VERSION = 1
"""Format version written by `BatchController.state_dict` and required by `from_state_dict`."""

_WORKER_KEYS = frozenset({"id", "cores", "min_batch", "max_batch", "batch", "ewma_ms", "throughput"})
_OPTIONAL_WORKER_KEYS = frozenset({"samples"})  # absent from states written before it was kept
_STATE_KEYS = frozenset({"version", "config", "workers", "adjustments"})


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
        c = positive(f"cores of {worker_id!r}", cores)
        cfg = self._config
        lo = cfg.min_batch if min_batch is None else integer(f"min_batch of {worker_id!r}", min_batch, minimum=1)
        hi = cfg.default_max_batch if max_batch is None else integer(f"max_batch of {worker_id!r}", max_batch, minimum=1)
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
        b = integer("batch", batch, minimum=1)
        ms = real("compute_ms", compute_ms)
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
        ctl._adjustments = integer("adjustments", state["adjustments"], minimum=0)
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
            w.batch = integer(f"batch of {worker_id!r}", batch)
            if not w.min_batch <= w.batch <= w.max_batch:
                raise ValueError(f"batch {w.batch} of {worker_id!r} is outside [{w.min_batch}, {w.max_batch}]")
        if ewma_ms is not None:
            if batch is None:
                raise ValueError(f"worker {worker_id!r} has a smoothed time but no batch")
            w.ewma_ms = real(f"ewma_ms of {worker_id!r}", ewma_ms)
            if w.ewma_ms < 0:
                raise ValueError(f"ewma_ms of {worker_id!r} must be >= 0, got {w.ewma_ms}")
        if throughput is not None:
            w.throughput = positive(f"throughput of {worker_id!r}", throughput)
        w.samples = integer(f"samples of {worker_id!r}", samples, minimum=0)
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
            return {k: clip(b, lower[k], upper[k]) for k, b in shares.items()}
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
            moved = {k: clip(round_half_up(targets[k]), lower[k], upper[k]) for k in movers}
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
        exact, lo, hi = water_fill(targets, total, lower, upper)
        kept = {k: current[k] for k in targets}
        if sum(kept.values()) == total and all(abs(b - exact[k]) < 1.0 for k, b in kept.items()):
            return kept
        return round_to_sum(exact, total, lo, hi)

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

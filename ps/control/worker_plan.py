"""The workers a batch policy plans for, and what every policy shares: their declared cores and batch
bounds, their current batch, the smoothed time and throughput measured at it, the exact-sum split of
the global batch B within the bounds, and the policy's state as plain data for checkpoints.

`WorkerPlan` is the base of every policy (uniform.py, static.py, dynamic.py, model/policy.py). A policy says
how B is split when the workers change (`_plan_weights`, or `replan` itself) and what one decision
does (`_decide`); the WorkerPlan does the bookkeeping, the bounds and the sum rule (OmniLearn Eq. 8)
and validates every input before it changes anything. Pure: no I/O, no clock, no transport.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from ps.control.checks import integer, positive, real
from ps.control.config import PolicyConfig
from ps.control.settings import Setting
from ps.control.split import clip, fit_to_sum, largest_remainder

STATE_VERSION = 1
"""Format version written by `WorkerPlan.state_dict` and required by `from_state_dict`."""

_WORKER_KEYS = frozenset({"id", "cores", "min_batch", "max_batch", "batch", "ewma_ms", "throughput"})
_OPTIONAL_WORKER_KEYS = frozenset({"samples"})  # absent from states written before it was kept
_STATE_KEYS = frozenset({"version", "config", "workers", "adjustments"})


@dataclass
class Worker:
    """The record of one worker.

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


class WorkerPlan:
    """Workers, bounds, the plan and its exact sum; the base of every batch policy.

    Usage: `add_worker`/`remove_worker` on membership changes, then `replan`; `observe` every push;
    `adjust` at the chosen granularity (e.g. each epoch). Every plan sums exactly to `global_batch`;
    without `keep_global_sum` (ASP) only where the bounds allow it, and B out of their reach is no error.
    """

    name: ClassVar[str] = ""
    """The `--controller` name of the policy (the registry's key)."""
    parks: ClassVar[bool] = False
    """Whether the policy may plan a batch of 0 (a parked worker)."""
    extra_state_keys: ClassVar[frozenset[str]] = frozenset()
    """Top-level state keys of the policy's own, beside the WorkerPlan's."""
    settings: ClassVar[tuple[Setting, ...]] = ()
    """The policy's own settings (its flags `--<name>-<setting>`); their values are `config.options`."""

    def __init__(self, config: PolicyConfig) -> None:
        if not isinstance(config, PolicyConfig):
            raise ValueError(f"config must be a PolicyConfig, got {type(config).__name__}")
        if config.policy != self.name:
            raise ValueError(f"a {self.name} policy cannot run under policy {config.policy!r}; build it from the registry")
        if config.micro_batch != 1:
            raise ValueError("a micro-batched plan is ps.control.micro.MicroBatched's; build it from the registry")
        self._config = config
        self._workers: dict[str, Worker] = {}
        self._adjustments = 0
        # True where a unit is a micro-batch (set by ps/control/micro.py): plans round to the shortest
        # round (split.round_to_sum's speeds) instead of by largest remainders, a unit being many samples
        self.round_for_time = False

    # ------------------------------------------------------------------ the interface
    @property
    def config(self) -> PolicyConfig:
        """The (immutable) settings."""
        return self._config

    @property
    def adjustments(self) -> int:
        """Number of `adjust` calls that changed the plan."""
        return self._adjustments

    def workers(self) -> list[str]:
        """Current worker ids, in the order they were added."""
        return list(self._workers)

    def worker_bounds(self) -> list[tuple[str, float, int | None, int | None]]:
        """(id, cores, min_batch, max_batch) per worker, None where a bound is the config's default
        (so a policy built under other settings takes its own default)."""
        cfg = self._config
        return [(k, w.cores, None if w.min_batch == cfg.min_batch else w.min_batch,
                 None if w.max_batch == cfg.default_max_batch else w.max_batch) for k, w in self._workers.items()]

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
        self._workers[worker_id] = Worker(cores=c, min_batch=lo, max_batch=hi)
        self._added(worker_id)

    def can_add(self, count: int = 1) -> bool:
        """Whether `count` more workers with the default min_batch fit: with `keep_global_sum` every
        worker needs at least its min_batch of the global batch."""
        cfg = self._config
        return not cfg.keep_global_sum or self._floor_sum(count * cfg.min_batch) <= cfg.global_batch

    def remove_worker(self, worker_id: str) -> None:
        """Forget a worker (left or failed); call `replan` to re-split its share of B."""
        if worker_id not in self._workers:
            raise ValueError(f"unknown worker {worker_id!r}")
        del self._workers[worker_id]
        self._removed(worker_id)

    def replan(self) -> dict[str, int]:
        """Split B over the current workers by the policy's `_plan_weights` and return the plan.

        The split is fitted to the bounds with an exact sum (ASP whose bounds cannot meet B: rounded
        and clipped). Raises ValueError, changing nothing, if the workers' max_batch cannot reach B
        under `keep_global_sum`.
        """
        if not self._workers:
            return {}
        self._apply(self._split(self._plan_weights()))
        return self.plan()

    def plan(self) -> dict[str, int]:
        """Current batch size of every planned worker (a copy; 0: parked)."""
        return {k: w.batch for k, w in self._workers.items() if w.batch is not None}

    def parked(self) -> list[str]:
        """The workers planned at batch 0: joined, but skipping rounds."""
        return [k for k, w in self._workers.items() if w.batch == 0]

    def observe(self, worker_id: str, batch: int, compute_ms: float, exposed_ms: float = 0.0) -> None:
        """Feed one measurement into the worker's EWMA: `compute_ms` is the time the policy balances
        (compute, busy or cycle time, by the job's --balance); `exposed_ms`, where the worker overlaps
        its push with backward, the communication it was left waiting for (ms; 0: not measured, as on
        ASP, the --allreduce fast path and a job without overlap).

        The EWMA ignores a `batch` that is not the worker's planned batch (computed under an older
        plan; a policy that fits time against batch may still use it). Raises ValueError, changing
        nothing, on an unknown worker, batch <= 0 or a time that is not finite and >= 0.
        """
        ms, exposed = self._check_observation(worker_id, batch, compute_ms, exposed_ms)
        self._record(worker_id, int(batch), ms, exposed)
        w = self._workers[worker_id]
        if w.batch is None or batch != w.batch:
            return
        alpha = self._config.ewma_alpha
        w.ewma_ms = ms if w.ewma_ms is None else alpha * ms + (1.0 - alpha) * w.ewma_ms
        w.samples += 1
        throughput = batch / w.ewma_ms if w.ewma_ms > 0 else math.inf
        if math.isfinite(throughput):
            w.throughput = throughput

    def observe_round(self, round_ms: float) -> None:
        """A BSP round closed `round_ms` after the one before (the server's clock, close to close)."""
        real("round_ms", round_ms)

    def smoothed_ms(self) -> dict[str, float | None]:
        """EWMA time per worker at its current batch (None: no observation since it changed)."""
        return {k: w.ewma_ms for k, w in self._workers.items()}

    def decision_due(self) -> bool:
        """Whether the policy wants a decision now, before the server's schedule (a probe measured)."""
        return False

    def adjust(self) -> dict[str, int]:
        """Make one decision (`_decide`) and return the (possibly unchanged) plan.

        Raises ValueError if a worker has no batch yet (call `replan` after `add_worker`).
        """
        unplanned = [k for k, w in self._workers.items() if w.batch is None]
        if unplanned:
            raise ValueError(f"workers {unplanned} have no batch yet; call replan() after add_worker()")
        if not self._workers:
            return self.plan()
        new_plan = self._decide()
        if new_plan is not None and self._apply(new_plan):
            self._adjustments += 1
        return self.plan()

    def report(self) -> dict[str, Any]:
        """What the last decision was based on, for its `adjust` record (a policy's own fields)."""
        return {}

    def global_batch_range(self) -> tuple[int, int | None]:
        """The global batches the workers' bounds can make up: [Σ min_batch, Σ max_batch], the upper
        end None where a worker's bound is the default (it follows B). --adaptive-batch keeps to it."""
        default = self._config.default_max_batch if self._config.max_batch is None else None
        lower = sum(w.min_batch for w in self._workers.values())
        if any(w.max_batch == default for w in self._workers.values()):
            return lower, None
        return lower, sum(w.max_batch for w in self._workers.values())

    def predicted_round_ms(self, total: int) -> float | None:
        """The policy's predicted round time (ms) at a global batch of `total`; None: it has no model
        (--adaptive-batch then predicts from the measured times)."""
        return None

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
            **self._extra_state(),
        }

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> WorkerPlan:
        """Rebuild a policy from `state_dict` output; raises ValueError on malformed or inconsistent state."""
        if not isinstance(state, Mapping):
            raise ValueError(f"policy state must be a mapping, got {type(state).__name__}")
        if not _STATE_KEYS <= set(state) <= _STATE_KEYS | cls.extra_state_keys:
            raise ValueError(f"policy state must have exactly the keys {sorted(_STATE_KEYS | cls.extra_state_keys)}, "
                             f"got {sorted(state)}")
        if state["version"] != STATE_VERSION:
            raise ValueError(f"unsupported policy state version {state['version']!r} (expected {STATE_VERSION})")
        raw_config = state["config"]
        if not isinstance(raw_config, Mapping):
            raise ValueError("policy state 'config' must be a mapping")
        try:
            config = PolicyConfig(**raw_config)
        except TypeError as exc:
            raise ValueError(f"bad policy config in state: {exc}") from None
        ctl = cls(config)
        entries = state["workers"]
        if not isinstance(entries, list):
            raise ValueError("policy state 'workers' must be a list")
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
        ctl._restore_extra(state)
        return ctl

    def adopt(self, old: WorkerPlan) -> None:
        """Take `old`'s workers and measurements into this fresh policy (a resume under new settings).

        Each worker keeps its cores and measurements (batch, smoothed time, throughput), and the
        adjustment count carries over; a bound equal to the old config's default (so taken from it)
        becomes this config's, one given per worker stays. The plan is kept only where it still is one
        of this policy's (`_keeps_plan_of`, and every batch within its new bounds); otherwise B is
        re-split by `replan`. Raises ValueError if the workers' bounds cannot meet the global batch.
        """
        if self._workers:
            raise ValueError("adopt() takes the workers into a policy that has none yet")
        before, config = old.config, self._config
        self._adjustments = old.adjustments
        replan = config != before and not (
            (before.global_batch, before.keep_global_sum) == (config.global_batch, config.keep_global_sum)
            and self._keeps_plan_of(old))
        for wid, w in old._workers.items():
            lower = None if w.min_batch == before.min_batch else w.min_batch
            upper = None if w.max_batch == before.default_max_batch else w.max_batch
            self.add_worker(wid, w.cores, lower, upper)
            new = self._workers[wid]
            new.throughput = w.throughput
            if w.batch is not None and (new.min_batch <= w.batch <= new.max_batch or (w.batch == 0 and self._may_park())):
                new.batch, new.ewma_ms, new.samples = w.batch, w.ewma_ms, w.samples
            elif w.batch is not None:
                replan = True
        self._adopted(old)
        if replan:
            self.replan()

    # ------------------------------------------------------------------ what a policy defines
    def _plan_weights(self) -> dict[str, float]:
        """Relative share of B per worker for `replan`."""
        raise NotImplementedError

    def _decide(self) -> dict[str, int] | None:
        """The plan after one decision (None: unchanged)."""
        return None

    def _keeps_plan_of(self, old: WorkerPlan) -> bool:
        """Whether `old`'s plan (same B and sum rule) stays a plan of this policy after a resume."""
        return False

    def _may_park(self) -> bool:
        """Whether this policy, under its settings, may plan a batch of 0."""
        return self.parks and self._config.park and self._config.keep_global_sum

    def _record(self, worker_id: str, batch: int, compute_ms: float, exposed_ms: float | None) -> None:
        """Hook: a checked observation, before the EWMA takes it (`exposed_ms` None: not measured)."""

    def _added(self, worker_id: str) -> None:
        """Hook: a worker was registered."""

    def _removed(self, worker_id: str) -> None:
        """Hook: a worker was forgotten."""

    def _adopted(self, old: WorkerPlan) -> None:
        """Hook: `adopt` took `old`'s workers (a policy of the same kind may take its own state too)."""

    def _extra_state(self) -> dict[str, Any]:
        """The policy's own state keys for `state_dict`."""
        return {}

    def _restore_extra(self, state: Mapping[str, Any]) -> None:
        """Load and validate the policy's own state keys (after the WorkerPlan's)."""

    # ------------------------------------------------------------------ shared helpers
    def _check_observation(self, worker_id: str, batch: int, compute_ms: float,
                           exposed_ms: float) -> tuple[float, float | None]:
        """The checked compute time, and the exposed time (None for 0: not measured)."""
        if worker_id not in self._workers:
            raise ValueError(f"unknown worker {worker_id!r}")
        integer("batch", batch, minimum=1)
        ms = real("compute_ms", compute_ms)
        if ms < 0:
            raise ValueError(f"compute_ms must be >= 0, got {ms}")
        exposed = real("exposed_ms", exposed_ms)
        if exposed < 0:
            raise ValueError(f"exposed_ms must be >= 0, got {exposed}")
        return ms, exposed if exposed > 0 else None

    def _floor_sum(self, extra: int) -> int:
        """The registered workers' min_batch summed, plus `extra`."""
        return extra + sum(w.min_batch for w in self._workers.values())

    def _restore_worker(self, worker_id: str, batch: Any, ewma_ms: Any, throughput: Any, samples: Any) -> None:
        """Validate and set the dynamic part of a worker record read from a state dict."""
        w = self._workers[worker_id]
        if batch is not None:
            w.batch = integer(f"batch of {worker_id!r}", batch)
            parked = w.batch == 0 and self._may_park()
            if not (parked or w.min_batch <= w.batch <= w.max_batch):
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

    def _opening_weights(self) -> dict[str, float]:
        """The first plan's weights: equal, or the declared cores (`dynamic_start` static)."""
        if self._config.dynamic_start == "uniform":
            return {k: 1.0 for k in self._workers}
        return {k: w.cores for k, w in self._workers.items()}

    def _measured_weights(self) -> dict[str, float]:
        """The workers' measured throughputs where known, the others estimated from the opening
        weights on the measured workers' scale; the opening weights when nobody is measured."""
        opening = self._opening_weights()
        known = {k: w.throughput for k, w in self._workers.items() if w.throughput is not None}
        if not known:
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
        return fit_to_sum(weights, cfg.global_batch, lower, upper, self.round_for_time)

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

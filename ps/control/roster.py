"""The workers a batch policy plans for and the plan in force: who joined (each worker's record,
worker_record.py), their batch bounds and what they can sum to, the measurements each push brings, and
the plan installed, split from weights by shares.py. Every input is checked before it changes
anything. Pure: no I/O, no clock, no transport."""

from __future__ import annotations

from collections.abc import Mapping

from ps.control import shares
from ps.control.config import PolicyConfig
from ps.control.worker_record import Worker, checked_observation, new_worker, own_bounds


class WorkerRoster:
    """The workers, their bounds and smoothed times, and the plan; the bookkeeping half of a batch
    policy (worker_plan.WorkerPlan adds the decisions and the checkpoints).

    Its hooks (`_added`, `_removed`, `_record`) tell a policy what changed, after the checks."""

    def __init__(self, config: PolicyConfig) -> None:
        self._config = config
        self._workers: dict[str, Worker] = {}
        # True where a unit is a micro-batch (set by ps/control/micro.py): plans round to the shortest
        # round (split.round_to_sum's speeds) instead of by largest remainders, a unit being many samples
        self.round_for_time = False

    @property
    def config(self) -> PolicyConfig:
        """The (immutable) settings."""
        return self._config

    def workers(self) -> list[str]:
        """Current worker ids, in the order they were added."""
        return list(self._workers)

    def worker_bounds(self) -> list[tuple[str, float, int | None, int | None]]:
        """(id, cores, min_batch, max_batch) per worker, None where a bound is the config's default
        (so a policy built under other settings takes its own default)."""
        return [(k, w.cores, *own_bounds(w, self._config)) for k, w in self._workers.items()]

    def add_worker(
        self, worker_id: str, cores: float = 1.0, min_batch: int | None = None, max_batch: int | None = None
    ) -> None:
        """Register a worker with its declared resources (Eq. 4a) and optional own batch bounds.

        The worker gets a batch at the next `replan`. Raises ValueError (nothing changes) on a
        duplicate id, cores <= 0, min > max, or, with `keep_global_sum`, if the workers' minimum
        batches would exceed the global batch.
        """
        if isinstance(worker_id, str) and worker_id in self._workers:
            raise ValueError(f"worker {worker_id!r} is already registered; remove it first or use another id")
        worker, cfg = new_worker(worker_id, cores, min_batch, max_batch, self._config), self._config
        if cfg.keep_global_sum and self._floor_sum(worker.min_batch) > cfg.global_batch:
            raise ValueError(
                f"cannot add {worker_id!r}: the workers' min_batch would sum to {self._floor_sum(worker.min_batch)} > "
                f"global_batch {cfg.global_batch}; lower min_batch or raise global_batch"
            )
        self._workers[worker_id] = worker
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
        if worker_id not in self._workers:
            raise ValueError(f"unknown worker {worker_id!r}")
        ms, exposed = checked_observation(batch, compute_ms, exposed_ms)
        self._record(worker_id, int(batch), ms, exposed)
        self._workers[worker_id].observe(batch, ms, self._config.ewma_alpha)

    def smoothed_ms(self) -> dict[str, float | None]:
        """EWMA time per worker at its current batch (None: no observation since it changed)."""
        return {k: w.ewma_ms for k, w in self._workers.items()}

    def global_batch_range(self) -> tuple[int, int | None]:
        """The global batches the workers' bounds can make up: [Σ min_batch, Σ max_batch], the upper
        end None where a worker's bound is the default (it follows B). --adaptive-batch keeps to it."""
        return shares.global_batch_range(self._workers, self._config)

    # ------------------------------------------------------------------ hooks for a policy
    def _record(self, worker_id: str, batch: int, compute_ms: float, exposed_ms: float | None) -> None:
        """Hook: a checked observation, before the EWMA takes it (`exposed_ms` None: not measured)."""

    def _added(self, worker_id: str) -> None:
        """Hook: a worker was registered."""

    def _removed(self, worker_id: str) -> None:
        """Hook: a worker was forgotten."""

    # ------------------------------------------------------------------ shared helpers
    def _floor_sum(self, extra: int) -> int:
        """The registered workers' min_batch summed, plus `extra`."""
        return extra + sum(w.min_batch for w in self._workers.values())

    def _bounds(self) -> tuple[dict[str, int], dict[str, int]]:
        """Per-worker lower and upper batch bounds."""
        return shares.bounds(self._workers)

    def _measured_weights(self) -> dict[str, float]:
        """The measured throughputs where known, the opening weights otherwise (shares.measured_weights)."""
        return shares.measured_weights(self._workers, self._config)

    def _split(self, weights: Mapping[str, float]) -> dict[str, int]:
        """Split B by `weights` within each worker's bounds (shares.split_batch)."""
        return shares.split_batch(self._workers, self._config, weights, self.round_for_time)

    def _exact_sum(self) -> bool:
        """Whether plans sum exactly to B (shares.exact_sum)."""
        return shares.exact_sum(self._workers, self._config)

    def _check_reachable(self) -> None:
        """Raise ValueError if the workers' max_batch cannot add up to B."""
        shares.check_reachable(self._workers, self._config)

    def _apply(self, new_plan: Mapping[str, int]) -> bool:
        """Install `new_plan`; a worker whose batch changes restarts its EWMA and its sample count (the
        policy waits for `min_samples` observations at the new batch). Returns whether anything changed."""
        changed = False
        for k, b in new_plan.items():
            changed = self._workers[k].set_batch(b) or changed
        return changed

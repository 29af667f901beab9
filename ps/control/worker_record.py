"""What a batch policy knows of one worker: its declared cores and batch bounds, its planned batch, and
the smoothed time and throughput measured at that batch; each input checked before it changes the
record (ValueError naming the worker). Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ps.control.checks import integer, positive, real
from ps.control.config import PolicyConfig


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

    def observe(self, batch: int, ms: float, alpha: float) -> None:
        """Take a checked time `ms` at `batch` into the EWMA (weight `alpha`), unless `batch` is not
        the planned one (computed under an older plan)."""
        if self.batch is None or batch != self.batch:
            return
        self.ewma_ms = ms if self.ewma_ms is None else alpha * ms + (1.0 - alpha) * self.ewma_ms
        self.samples += 1
        throughput = batch / self.ewma_ms if self.ewma_ms > 0 else math.inf
        if math.isfinite(throughput):
            self.throughput = throughput

    def set_batch(self, batch: int) -> bool:
        """Plan `batch`; a change restarts the EWMA and the sample count. Returns whether it changed."""
        if self.batch == batch:
            return False
        self.batch, self.ewma_ms, self.samples = batch, None, 0
        return True


def new_worker(worker_id: str, cores: float, min_batch: int | None, max_batch: int | None,
               config: PolicyConfig) -> Worker:
    """A worker's record from its declared resources (Eq. 4a) and own bounds (None: the config's);
    ValueError on an empty id, cores <= 0 or min > max."""
    if not isinstance(worker_id, str) or not worker_id:
        raise ValueError(f"worker_id must be a non-empty string, got {worker_id!r}")
    c = positive(f"cores of {worker_id!r}", cores)
    lo = config.min_batch if min_batch is None else integer(f"min_batch of {worker_id!r}", min_batch, minimum=1)
    hi = config.default_max_batch if max_batch is None else integer(f"max_batch of {worker_id!r}", max_batch, minimum=1)
    if lo > hi:
        raise ValueError(f"worker {worker_id!r}: min_batch {lo} exceeds max_batch {hi}")
    return Worker(cores=c, min_batch=lo, max_batch=hi)


def own_bounds(worker: Worker, config: PolicyConfig) -> tuple[int | None, int | None]:
    """The worker's (min_batch, max_batch), None where a bound is `config`'s default (so a policy built
    under other settings takes its own default)."""
    return (None if worker.min_batch == config.min_batch else worker.min_batch,
            None if worker.max_batch == config.default_max_batch else worker.max_batch)


def checked_observation(batch: int, compute_ms: float, exposed_ms: float) -> tuple[float, float | None]:
    """The checked compute time, and the exposed time (None for 0: not measured); ValueError on a
    batch <= 0 or a time that is not finite and >= 0."""
    integer("batch", batch, minimum=1)
    ms = real("compute_ms", compute_ms)
    if ms < 0:
        raise ValueError(f"compute_ms must be >= 0, got {ms}")
    exposed = real("exposed_ms", exposed_ms)
    if exposed < 0:
        raise ValueError(f"exposed_ms must be >= 0, got {exposed}")
    return ms, exposed if exposed > 0 else None

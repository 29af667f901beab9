"""The samples a worker trains on under `--sampling exact`: the slice of the epoch's permutation its
server handed it in the reply that told its batch size (ps.rounds.sampling), checked, and turned into
dataset indices (common.job.epoch_order). The next step's slice is known as soon as the reply's header
is in, before the step's batch is drawn, so a loader can start reading it at once.

The audit hook: with PS_TRAINED_INDICES=FILE in its environment a worker appends one JSON line to FILE
for every step whose push the server took ({"worker", "worker_id", "round", "version", "ranges": [[epoch, offset,
count], ...], "indices": [...]}), which is how the tests check that every sample is trained once per
epoch. It is meant for tests and audits, not for production runs (a line per step)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import torch

from common.job.epoch_order import slice_indices
from common.transport.messages import StepHeader
from worker.client import ServerError

AUDIT_ENV = "PS_TRAINED_INDICES"


class BadSlice(ServerError):
    """The server handed a slice this worker cannot train on (the worker leaves)."""

    def __init__(self, message: str) -> None:
        super().__init__("INVALID_ARGUMENT", message)


def check_slice(plan: StepHeader, num_samples: int, last_epoch: int) -> None:
    """BadSlice unless `plan`'s slice is ranges of epochs plan.epoch..`last_epoch` within the
    `num_samples` training samples, whose counts sum to the batch size it tells."""
    total = 0
    for r in plan.slice:
        if not (plan.epoch <= r.epoch <= last_epoch and r.offset >= 0 and r.count >= 1 and r.stop <= num_samples):
            raise BadSlice(f"the server handed samples [{r.offset}, {r.stop}) of epoch {r.epoch}, outside this "
                           f"worker's {num_samples} training samples or epochs {plan.epoch}..{last_epoch}")
        total += r.count
    if total != plan.batch_size:
        raise BadSlice(f"the server handed a slice of {total} samples for a batch of {plan.batch_size}")


class SliceSampler:
    """Stands where worker.sampler.ElasticBatchSampler does: `next_batch()` is the current plan's slice.
    `batch_size` follows the plan (set by the session, as for the sampler)."""

    def __init__(self, num_samples: int, seed: int, last_epoch: int, plan: Callable[[], StepHeader]) -> None:
        self.num_samples, self.seed, self.last_epoch = num_samples, seed, last_epoch
        self._plan = plan
        self.batch_size = 1

    def check(self, plan: StepHeader) -> None:
        """A plan that gives a batch must hand its slice (see check_slice)."""
        if plan.batch_size > 0 and not plan.done:
            check_slice(plan, self.num_samples, self.last_epoch)

    def next_batch(self) -> torch.Tensor:
        plan = self._plan()
        self.check(plan)
        return slice_indices(self.seed, self.num_samples, plan.slice)


class TrainedLog:
    """The audit hook (see the module's docstring); does nothing unless PS_TRAINED_INDICES is set."""

    def __init__(self, worker: str, path: str | None = None) -> None:
        path = path if path is not None else os.environ.get(AUDIT_ENV, "")
        self.path = Path(path) if path else None
        self.worker = worker

    def write(self, step: tuple[StepHeader, torch.Tensor] | None, worker_id: str) -> None:
        """A line for the batch drawn at `step` = (its plan, its indices), if the plan handed a slice;
        `worker_id`: the session's id that pushed it (a rejoin changes it)."""
        if self.path is None or step is None or not step[0].slice:
            return
        plan, indices = step
        line = {"worker": self.worker, "worker_id": worker_id, "round": plan.round, "version": plan.version,
                "ranges": [[r.epoch, r.offset, r.count] for r in plan.slice], "indices": indices.tolist()}
        with self.path.open("a") as f:
            f.write(json.dumps(line) + "\n")

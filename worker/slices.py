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
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset as TorchDataset

from common.job.epoch_order import slice_indices
from common.transport.messages import SliceRange, StepHeader
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


class SliceSource:
    """The index source of worker.loader.Batches under --sampling exact (where worker.sampler's
    ElasticBatchSampler stands otherwise): the next step's indices are the slice of the latest plan.

    `follow(plan)` takes a reply's plan (checked: check_slice) and says whether it hands a new slice;
    the session then drops what the loader prepared of the previous one and submits this one at once,
    so the loader reads it while the reply's parameters arrive. A slice the loader prepared and the
    step never trained on (the plan changed: a re-split, a refused push, an eviction) is simply dropped:
    the server took it back and serves it again, to this worker or another. So the loader prepares one
    batch ahead here, whatever its --prefetch: no later slice is known before the next reply."""

    def __init__(self, num_samples: int, seed: int, last_epoch: int) -> None:
        self.num_samples, self.seed, self.last_epoch = num_samples, seed, last_epoch
        self.batch_size = 1  # set by the session from the plan, as for the sampler
        self._ranges: tuple[SliceRange, ...] = ()  # the latest plan's slice
        self._fresh = False  # announced and not drawn yet
        self.drawn = torch.empty(0, dtype=torch.int64)  # the indices drawn last

    def follow(self, plan: StepHeader) -> bool:
        """Take `plan`'s slice as the next step's (BadSlice if it cannot be trained on); False if it is
        the one already waiting to be drawn. A slice drawn before and handed again is trained again:
        the server had not taken its push (a refused push, a lost reply)."""
        ranges: tuple[SliceRange, ...] = ()
        if plan.batch_size > 0 and not plan.done:
            check_slice(plan, self.num_samples, self.last_epoch)
            ranges = plan.slice
        if ranges == self._ranges and self._fresh:
            return False
        self._ranges, self._fresh = ranges, bool(ranges)
        return True

    def ready(self) -> bool:
        """Whether a slice is there to draw (the loader submits only what is known)."""
        return self._fresh

    def draw(self, count: int) -> torch.Tensor:
        if not self._fresh or count != sum(r.count for r in self._ranges):
            raise RuntimeError(f"no slice of {count} samples from the server for this step")
        self._fresh = False
        self.drawn = slice_indices(self.seed, self.num_samples, self._ranges)
        return self.drawn

    def put_back(self, indices: torch.Tensor) -> None:
        """A prepared batch given up: nothing to keep, the server serves its samples again."""


@dataclass(frozen=True)
class OwnData:
    """A user's own training set (connect(dataset=...), Session.batches(dataset)): every worker declares
    its length and `fingerprint` at Join, and the server refuses one that differs from its training set's
    length (or from the first worker's fingerprint), FAILED_PRECONDITION naming both; the slices the
    server hands out index it like the job's own training set."""

    dataset: TorchDataset
    fingerprint: str = ""

    @classmethod
    def checked(cls, dataset: TorchDataset, num_samples: int, fingerprint: str = "") -> OwnData:
        """ValueError unless `dataset` is a map-style dataset of the job's `num_samples` samples."""
        length = len(dataset) if hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__") else None
        if length is None:
            raise ValueError("your own data must be a map-style dataset (__len__, __getitem__), "
                             f"got {type(dataset).__name__}")
        if length != num_samples:
            raise ValueError(f"your dataset has {length} samples, the job's training set has {num_samples}: "
                             "the server hands out slices of that many")
        return cls(dataset, fingerprint)

    def declared(self) -> tuple[int, str]:
        """What a Join declares: (length, fingerprint)."""
        return len(self.dataset), self.fingerprint


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

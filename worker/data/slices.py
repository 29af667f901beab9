"""The samples a worker trains on under `--sampling exact`: the slice of the epoch's permutation its
server handed it in the reply that told its batch size (ps.rounds.sampling), checked, and turned into
dataset indices (common.job.epoch_order). The next step's slice is known as soon as the reply's header
is in, before the step's batch is drawn, so a loader can start reading it at once; the slice of the step
after comes with it (handed ahead while the plan holds), so the loader reads it during the step.

The audit hook: with PS_TRAINED_INDICES=FILE in its environment a worker appends one JSON line to FILE
for every step whose push the server took ({"worker", "worker_id", "round", "version", "ranges": [[epoch, offset,
count], ...], "indices": [...]}), which is how the tests check that every sample is trained once per
epoch. It is meant for tests and audits, not for production runs (a line per step)."""

from __future__ import annotations

from typing import Any

import collections
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset as TorchDataset

from common.job.epoch_order import slice_indices
from common.transport.messages import SliceRange, StepHeader
from worker.transport.client import ServerError

AUDIT_ENV = "PS_TRAINED_INDICES"


class BadSlice(ServerError):
    """The server handed a slice this worker cannot train on (the worker leaves)."""

    def __init__(self, message: str) -> None:
        super().__init__("INVALID_ARGUMENT", message)


def check_slice(plan: StepHeader, num_samples: int, last_epoch: int) -> None:
    """BadSlice unless `plan`'s slice, and its slice ahead if any, are ranges of epochs
    plan.epoch..`last_epoch` within the `num_samples` training samples whose counts sum to the batch
    size it tells, no sample of an epoch in two of them (one epoch trains each sample once)."""
    for ranges, what in ((plan.slice, "a slice"), (plan.next_slice, "a slice ahead")):
        if what == "a slice ahead" and not ranges:
            continue
        total = 0
        for r in ranges:
            if not (plan.epoch <= r.epoch <= last_epoch and r.offset >= 0 and r.count >= 1 and r.stop <= num_samples):
                raise BadSlice(f"the server handed samples [{r.offset}, {r.stop}) of epoch {r.epoch}, outside this "
                               f"worker's {num_samples} training samples or epochs {plan.epoch}..{last_epoch}")
            total += r.count
        if total != plan.batch_size:
            raise BadSlice(f"the server handed {what} of {total} samples for a batch of {plan.batch_size}")
    handed = sorted((r.epoch, r.offset, r.stop) for r in (*plan.slice, *plan.next_slice))
    for (epoch, _, stop), (next_epoch, offset, _) in zip(handed, handed[1:]):
        if epoch == next_epoch and offset < stop:  # a sample twice in one epoch: trained twice, another never
            raise BadSlice(f"the server handed samples of epoch {epoch} twice (from {offset}, before {stop}), in one "
                           f"step's slice or in its slice and the one ahead")


Ranges = tuple[SliceRange, ...]


class SliceSource:
    """The index source of worker.data.loader.Batches under --sampling exact (where worker.data.sampler's
    ElasticBatchSampler stands otherwise): the next steps' indices are the slices the latest plan
    handed, its slice and its slice ahead.

    `follow(plan)` takes a reply's plan (checked: check_slice). Where the plan's slice is the one
    already waiting (handed ahead by the reply before), what the loader prepared is kept and the slice
    ahead is added after it, so the loader reads it during the step; otherwise (a re-split, a refused
    push, an eviction: the server took the slices back, to serve them again) `follow` says so, and the
    session drops what the loader prepared and submits the plan's slices at once."""

    def __init__(self, num_samples: int, seed: int, last_epoch: int) -> None:
        self.num_samples, self.seed, self.last_epoch = num_samples, seed, last_epoch
        self.batch_size = 1  # set by the session from the plan, as for the sampler
        self._known: collections.deque[Ranges] = collections.deque()  # handed, not drawn yet, in step order
        self._drawn: collections.deque[tuple[Ranges, torch.Tensor]] = collections.deque()  # drawn, not trained

    def follow(self, plan: StepHeader) -> bool:
        """Take `plan`'s slices as the next steps' (BadSlice if they cannot be trained on); True if what
        was drawn ahead is no longer wanted (the loader drops it). A slice trained before and handed
        again is trained again: the server had not taken its push (a refused push, a lost reply)."""
        wanted: list[Ranges] = []
        if plan.batch_size > 0 and not plan.done:
            check_slice(plan, self.num_samples, self.last_epoch)
            wanted = [plan.slice] + ([plan.next_slice] if plan.next_slice else [])
        upcoming = [ranges for ranges, _ in self._drawn] + list(self._known)
        if wanted and upcoming[:len(wanted)] == wanted[:len(upcoming)]:
            self._known.extend(wanted[len(upcoming):])
            return False
        self._drawn.clear()
        self._known = collections.deque(wanted)
        return True

    def ready(self) -> bool:
        """Whether a slice is there to draw (the loader submits only what is known)."""
        return bool(self._known)

    def draw(self, count: int) -> torch.Tensor:
        if not self._known or count != sum(r.count for r in self._known[0]):
            raise RuntimeError(f"no slice of {count} samples from the server for this step")
        ranges = self._known.popleft()
        indices = slice_indices(self.seed, self.num_samples, ranges)
        self._drawn.append((ranges, indices))
        return indices

    def taken(self) -> torch.Tensor:
        """The indices of the batch the step trains on: the oldest drawn."""
        return self._drawn.popleft()[1]

    def put_back(self, indices: torch.Tensor) -> None:
        """Prepared batches given up: nothing to keep, the server serves their samples again."""
        self._drawn.clear()


@dataclass(frozen=True)
class OwnData:
    """A user's own training set (connect(dataset=...), Session.batches(dataset)): every worker declares
    its length and `fingerprint` at Join, and the server refuses one that differs from its training set's
    length (or from the first worker's fingerprint), FAILED_PRECONDITION naming both; the slices the
    server hands out index it like the job's own training set."""

    dataset: TorchDataset[Any]
    fingerprint: str = ""

    @classmethod
    def checked(cls, dataset: TorchDataset[Any], num_samples: int, fingerprint: str = "") -> OwnData:
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
        return len(self.dataset), self.fingerprint  # type: ignore[arg-type]  # OwnData.checked took only a dataset with __len__


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

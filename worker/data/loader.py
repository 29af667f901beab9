"""The worker's loader: prepares the next batches of a map-style dataset while the current step computes.

Batches are asked for by their sample indices (`submit`), in order, and taken in the same order
(`take`). Any index list may be submitted: the worker's own sampler's, or a slice of an epoch's
permutation that the server hands out one or more steps ahead. Under it is `torch.utils.data`'s
DataLoader: its batch_sampler is the queue of submitted index lists, read by a feeder thread that
iterates the DataLoader and hands each batch on. So with `workers` 0 the samples are read and
collated by that thread beside the training step; with `workers` N by N loader processes (spawned:
a fork of a process whose gRPC threads run is not safe), `prefetch` batches in flight between them.
The DataLoader is iterated once, over an endless stream of index lists, so its processes live as long
as the loader, across epochs (what `persistent_workers` gives an ordinary DataLoader between epochs),
and end when it closes. On a GPU the batches come in pinned memory and are copied with non_blocking.

Nothing is rebuilt when the batch size changes: the next index lists are simply of the new size.
Batches submitted at the old size and not yet taken can be given up (`discard`: their indices come
back, in order, to be submitted again); what the loader already prepared of them is dropped as it
arrives.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.utils.data import DataLoader, default_collate
from torch.utils.data import Dataset as TorchDataset

from common.job.disk_datasets import CorruptSample
from common.job.splits import in_memory

_END = object()


class LoaderError(RuntimeError):
    """The dataset failed to produce a batch (a corrupt file, a factory's bug); the message says why,
    on its first line; `path`: the file the dataset could not decode, where it named one."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path

    def reason(self) -> str:
        """What the worker tells the server as it leaves over it: "corrupt sample PATH" where the
        dataset named the file it could not decode, else "data error: " and the message."""
        return f"corrupt sample {self.path}" if self.path else f"data error: {self}"


@dataclass(frozen=True)
class _Failed:
    """A batch the dataset (or the collation) failed to give, handed on in its place: its error's line
    and the file to blame. Both cross from a loader process as they are, where a DataLoader process's
    own error comes back as the text of its traceback (the exception's type before its message, the
    file only inside that text), so an error reads the same with --loader-workers as without."""

    line: str
    path: str | None


def _failed(exc: Exception) -> _Failed:
    path = exc.path if isinstance(exc, CorruptSample) else None
    return _Failed(_first_line(exc), path or None)


class _Guarded(TorchDataset[Any]):
    """`dataset`, whose batches are read where the DataLoader reads them (a loader process, or the
    feeder thread) and come as a _Failed where reading one raises."""

    def __init__(self, dataset: TorchDataset[Any]) -> None:
        self.dataset = dataset

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> Any:
        try:
            many = getattr(self.dataset, "__getitems__", None)
            return many(indices) if many else [self.dataset[i] for i in indices]
        except Exception as exc:  # noqa: BLE001 - handed on as the batch, raised by take() as a LoaderError
            return _failed(exc)


def _collate(samples: Any) -> Any:
    """default_collate, a _Failed passed on as it is, and a collation that raises as a _Failed."""
    if isinstance(samples, _Failed):
        return samples
    try:
        return default_collate(samples)
    except Exception as exc:  # noqa: BLE001 - as in _Guarded
        return _failed(exc)


@dataclass(frozen=True)
class LoaderOptions:
    """`ps-worker --loader-workers N --prefetch D`: loader processes (0: a thread in the training
    process) and batches prepared ahead of the one being computed."""

    workers: int = 0
    prefetch: int = 2

    def __post_init__(self) -> None:
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 0:
            raise ValueError(f"loader workers must be a whole number >= 0, got {self.workers!r}")
        if isinstance(self.prefetch, bool) or not isinstance(self.prefetch, int) or self.prefetch < 1:
            raise ValueError(f"prefetch must be a whole number >= 1, got {self.prefetch!r}")


class _Requests:
    """The DataLoader's batch_sampler: the submitted index lists, in order, until closed."""

    def __init__(self) -> None:
        self.queue: queue.Queue[Any] = queue.Queue()

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            item = self.queue.get()
            if item is _END:
                return
            yield item


class BatchLoader:
    """Batches of `dataset` at submitted indices, prepared ahead (see the module's docstring)."""

    def __init__(self, dataset: TorchDataset[Any], options: LoaderOptions = LoaderOptions(),
                 device: torch.device | None = None) -> None:
        self.options = options
        self.device = device or torch.device("cpu")
        self._requests = _Requests()
        self._ready: queue.Queue[Any] = queue.Queue()
        self._submitted: collections.deque[tuple[int, torch.Tensor]] = collections.deque()  # (ticket, indices)
        self._tickets = 0
        self._dropped: set[int] = set()
        self._taken = 0  # tickets the feeder delivered and take() consumed (kept or dropped)
        workers = options.workers
        per_process = -(-options.prefetch // workers) if workers else 0
        # DataLoader asks for its next index list before it hands a batch on, and holds this many
        self.ahead = per_process * workers
        self._loader = DataLoader(
            _Guarded(dataset), batch_sampler=self._requests, collate_fn=_collate, num_workers=workers,
            pin_memory=self.device.type == "cuda",
            prefetch_factor=per_process or None,
            multiprocessing_context="spawn" if workers else None,
        )
        self._closed = False
        self._feeder = threading.Thread(target=self._feed, name="batch-loader", daemon=True)
        self._feeder.start()

    def _feed(self) -> None:
        try:
            for batch in self._loader:
                self._ready.put(batch)
        except BaseException as exc:  # noqa: BLE001 - handed to take(), which raises it in the training thread
            self._ready.put(exc)
        self._ready.put(_END)

    @property
    def pending(self) -> list[int]:
        """The sizes of the batches submitted and not yet taken, oldest first."""
        return [len(indices) for _, indices in self._submitted]

    def submit(self, indices: torch.Tensor | list[int]) -> None:
        """Ask for the batch of samples `indices` (after those already asked for)."""
        if self._closed:
            raise RuntimeError("the loader is closed")
        index = torch.as_tensor(indices, dtype=torch.int64).reshape(-1)
        if index.numel() == 0:
            raise ValueError("a batch needs at least one index")
        self._submitted.append((self._tickets, index))
        self._put(index)

    def _put(self, index: torch.Tensor) -> None:
        self._tickets += 1
        self._requests.queue.put(index.tolist())

    def discard(self) -> torch.Tensor:
        """Give up every batch submitted and not yet taken; their indices, in submission order."""
        given_up = [indices for _, indices in self._submitted]
        self._dropped.update(ticket for ticket, _ in self._submitted)
        self._submitted.clear()
        return torch.cat(given_up) if given_up else torch.empty(0, dtype=torch.int64)

    def take(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The oldest submitted batch (inputs, labels) on the loader's device, waiting until it is ready."""
        if not self._submitted:
            raise RuntimeError("take() without a submitted batch")
        ticket, _ = self._submitted.popleft()
        while self._tickets - ticket - 1 < self.ahead:  # too little asked for after it: one-sample fillers, dropped
            self._dropped.add(self._tickets)
            self._put(torch.zeros(1, dtype=torch.int64))
        while True:
            item = self._ready.get()
            if item is _END:
                raise LoaderError("the loader stopped")
            if isinstance(item, _Failed):  # the dataset's error, whichever batch it came in
                self._closed = True
                raise LoaderError(item.line, item.path)
            if isinstance(item, BaseException):  # the DataLoader's own (a loader process that died)
                self._closed = True
                raise LoaderError(_first_line(item)) from item
            delivered, self._taken = self._taken, self._taken + 1
            if delivered in self._dropped:
                self._dropped.discard(delivered)
                continue
            assert delivered == ticket, (delivered, ticket)
            x, y = item
            if self.device.type != "cpu":
                x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            return x, y

    def close(self) -> None:
        """Stop the feeder and the loader processes (batches not taken are dropped)."""
        if self._feeder.is_alive():
            self._requests.queue.put(_END)
            self._feeder.join(timeout=30)
        self._closed = True


def _first_line(exc: BaseException) -> str:
    """The line that says what went wrong: a DataLoader process's error comes with its traceback,
    whose last line names the error (e.g. the file that cannot be decoded)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


class IndexSource(Protocol):
    """Where a session's next indices come from: `draw(n)` gives the next n, `put_back(indices)`
    returns indices drawn and not trained on (a batch given up when the batch size changed), to be
    drawn first next time. worker.data.sampler.ElasticBatchSampler is one (each worker's own sampling)."""

    def draw(self, count: int) -> torch.Tensor: ...

    def put_back(self, indices: torch.Tensor) -> None: ...

    def ready(self) -> bool:
        """Whether the next indices are known (a sampler: always; the server's slices: once told)."""
        ...


class Batches:
    """A session's batches: the next `batch_size` indices from `source`, read by a BatchLoader kept
    `prefetch` batches ahead, or, for a split held whole in memory with no loader processes, the
    tensors indexed directly (no thread: as fast as indexing). `wait_ms` is the last batch's wait."""

    def __init__(self, split: TorchDataset[Any], source: IndexSource, options: LoaderOptions = LoaderOptions(),
                 device: torch.device | None = None) -> None:
        self.source = source
        self.options = options
        self.device = device or torch.device("cpu")
        self.wait_ms = 0.0
        tensors = in_memory(split) if options.workers == 0 else None
        self._tensors = None if tensors is None else (tensors[0].to(self.device), tensors[1].to(self.device))
        self._loader = None if tensors is not None else BatchLoader(split, options, self.device)

    def next(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch of `batch_size` samples; batches prepared at another size are given up
        and their indices drawn again."""
        started = time.perf_counter()
        if self._tensors is not None:
            index = self.source.draw(batch_size).to(self._tensors[0].device)
            batch = self._tensors[0][index], self._tensors[1][index]
        else:
            loader = self._loader
            assert loader is not None
            if any(size != batch_size for size in loader.pending):
                self.source.put_back(loader.discard())
            self._submit(batch_size)
            batch = loader.take()
        self.wait_ms = (time.perf_counter() - started) * 1000.0
        return batch

    def _submit(self, batch_size: int) -> None:
        """Keep the loader `prefetch` batches ahead, as far as the source knows its next indices."""
        loader = self._loader
        assert loader is not None
        while len(loader.pending) < 1 + max(self.options.prefetch, loader.ahead) and self.source.ready():
            loader.submit(self.source.draw(batch_size))

    def renew(self, batch_size: int, drop: bool = True) -> None:
        """The source knows new next indices (worker.data.slices.SliceSource: slices from the server): start
        on them now, after dropping what was prepared if `drop` (they replace it)."""
        if self._loader is not None:
            if drop:
                self._loader.discard()
            self._submit(batch_size)

    def close(self) -> None:
        if self._loader is not None:
            self._loader.close()

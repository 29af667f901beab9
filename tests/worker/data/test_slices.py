"""The worker's side of exactly-once epochs: the slices a plan hands (and the slice ahead) drive the
loader, which reads the slice ahead during the step, keeps it when the next plan hands it, and drops it
when the server took it back."""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import Dataset

from common.job.epoch_order import slice_indices
from common.transport.messages import SliceRange, StepHeader
from worker.data.loader import Batches, LoaderOptions
from worker.data.slices import BadSlice, SliceSource

N, SEED = 100, 7


class Recorded(Dataset):
    """Sample i is (i, i); every index read is recorded, in order."""

    def __init__(self) -> None:
        self.read: list[int] = []

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        self.read.append(int(i))
        return torch.tensor([float(i)]), int(i)


def plan(batch: int, now: tuple[int, ...], ahead: tuple[int, ...] = ()) -> StepHeader:
    """A plan whose slice is epoch 0's [now[0], now[0] + batch), and [ahead[0], ...) ahead."""
    return StepHeader(round=1, version=1, epoch=0, batch_size=batch, done=False, lr=0.1, global_batch=batch,
                      slice=tuple(SliceRange(0, o, batch) for o in now),
                      next_slice=tuple(SliceRange(0, o, batch) for o in ahead))


def indices(offset: int, batch: int) -> list[int]:
    return slice_indices(SEED, N, (SliceRange(0, offset, batch),)).tolist()


def step(source: SliceSource, batches: Batches, batch: int) -> list[int]:
    """What a session does at each step: the next batch, and the indices it trains on."""
    _, y = batches.next(batch)
    trained = source.taken().tolist()
    assert y.tolist() == trained
    return trained


@pytest.fixture
def loader() -> tuple[SliceSource, Batches, Recorded]:
    data = Recorded()
    source = SliceSource(N, SEED, last_epoch=3)
    batches = Batches(data, source, LoaderOptions(workers=0, prefetch=2))
    yield source, batches, data
    batches.close()


def test_the_slice_ahead_is_read_before_the_next_plan_and_kept_when_it_hands_it(loader) -> None:
    source, batches, data = loader
    assert not source.follow(plan(10, (0,), (10,)))  # the first plan: nothing prepared to drop
    batches.renew(10, drop=False)
    assert step(source, batches, 10) == indices(0, 10)
    # the slice ahead was submitted with the first: the loader reads it before the next plan comes
    deadline = time.monotonic() + 30
    while len(data.read) < 20 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert data.read[10:20] == indices(10, 10)
    assert not source.follow(plan(10, (10,), (20,)))  # it is the next: kept, and the one after is added
    batches.renew(10, drop=False)
    assert step(source, batches, 10) == indices(10, 10)
    assert data.read.count(indices(10, 10)[0]) == 1  # read once


def test_a_slice_taken_back_is_dropped_and_the_plans_slices_read_at_once(loader) -> None:
    source, batches, _ = loader
    source.follow(plan(10, (0,), (10,)))
    batches.renew(10, drop=False)
    assert step(source, batches, 10) == indices(0, 10)
    assert source.follow(plan(12, (10,), (22,)))  # re-split: the server took [10, 20) back
    batches.renew(12, drop=True)
    assert step(source, batches, 12) == indices(10, 12)
    assert not source.follow(plan(12, (22,)))  # no slice ahead (the job's last samples): nothing more
    batches.renew(12, drop=False)
    assert step(source, batches, 12) == indices(22, 12)
    assert not source.ready()


def test_a_slice_handed_again_after_a_refused_push_is_trained_again(loader) -> None:
    source, batches, _ = loader
    source.follow(plan(10, (0,), (10,)))
    batches.renew(10, drop=False)
    first = step(source, batches, 10)
    assert source.follow(plan(10, (0,), (10,)))  # the same reply again: its push was not taken
    batches.renew(10, drop=True)
    assert step(source, batches, 10) == first


def test_a_slice_ahead_that_is_not_whole_is_refused() -> None:
    source = SliceSource(N, SEED, last_epoch=3)
    bad = StepHeader(round=1, version=1, epoch=0, batch_size=10, done=False, lr=0.1, global_batch=10,
                     slice=(SliceRange(0, 0, 10),), next_slice=(SliceRange(0, 10, 4),))
    with pytest.raises(BadSlice, match="a slice ahead of 4 samples for a batch of 10"):
        source.follow(bad)

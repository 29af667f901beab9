"""The shards' ranges (ps/shards/ranges.py): a buffer split contiguously, impossible splits refused, and
an optimizer state sliced per shard and merged back (pure)."""

from __future__ import annotations

import itertools

import pytest
import torch

from common.job.spec import JobSpec
from ps.shards.ranges import merge_optimizer_states, slice_optimizer_state, split_ranges
from tests.torch_reference import torch_optimizer


@pytest.mark.parametrize(("numel", "shards"), [(10, 1), (10, 3), (2410, 2), (7, 7)])
def test_split_ranges_cover_the_buffer_contiguously(numel: int, shards: int) -> None:
    ranges = split_ranges(numel, shards)
    assert len(ranges) == shards and ranges[0][0] == 0 and ranges[-1][1] == numel
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    sizes = [stop - start for start, stop in ranges]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


@pytest.mark.parametrize(("numel", "shards"), [(5, 6), (10, 0)])
def test_split_ranges_refuses_impossible_splits(numel: int, shards: int) -> None:
    with pytest.raises(ValueError):
        split_ranges(numel, shards)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_optimizer_state_slices_and_merges_back(optimizer: str) -> None:
    spec = JobSpec(optimizer=optimizer, momentum=0.9 if optimizer == "sgd" else 0.0)
    param = torch.nn.Parameter(torch.randn(11))
    opt = torch_optimizer(param, spec)
    for _ in range(2):
        param.grad = torch.randn(11)
        opt.step()
    state = opt.state_dict()
    ranges = split_ranges(11, 3)
    parts = [slice_optimizer_state(state, 11, start, stop) for start, stop in ranges]
    merged = merge_optimizer_states(parts, ranges)
    for name, value in state["state"][0].items():
        assert torch.equal(merged["state"][0][name], value), name
    assert merged["param_groups"] == state["param_groups"]

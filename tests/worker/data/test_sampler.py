"""The worker's elastic sampler: every batch has exactly the planned size, also at the end of an epoch.

The server refuses a push whose batch size is not the one it planned for that worker, so there must
be no smaller last batch: a batch that runs past the end of the permutation continues in the next.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.data.sampler import ElasticBatchSampler


@settings(max_examples=50, deadline=None)
@given(num_samples=st.integers(1, 50), sizes=st.lists(st.integers(1, 70), min_size=1, max_size=12), seed=st.integers(0, 99))
def test_every_batch_has_the_planned_size_across_reshuffles(num_samples: int, sizes: list[int], seed: int) -> None:
    sampler = ElasticBatchSampler(num_samples, seed=seed)
    drawn = []
    for size in sizes:
        sampler.batch_size = size
        batch = sampler.next_batch()
        assert batch.numel() == size  # larger than the whole split too: it spans reshuffles
        drawn.append(batch)
    everything = torch.cat(drawn)
    for start in range(0, everything.numel() - num_samples + 1, num_samples):  # each pass is a permutation
        assert sorted(everything[start : start + num_samples].tolist()) == list(range(num_samples))


def test_a_batch_size_below_one_is_refused() -> None:
    sampler = ElasticBatchSampler(10, seed=0)
    with pytest.raises(ValueError, match="batch size must be >= 1"):
        sampler.batch_size = 0
    assert sampler.batch_size == 1

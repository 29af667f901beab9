"""Batch-weighted aggregation equals one process's gradient on the concatenated batch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from common.job.datasets import build_dataset
from common.job.models import build_model
from common.params.aggregation import WeightedMean, asp_lr, weighted_mean
from common.transport.layout import flatten_grads

DATA = build_dataset("digits", {}, 0)


def mean_gradient(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    return flatten_grads(model).clone()


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=5))
def test_streaming_weighted_mean_equals_concatenated_batch(batches: list[int]) -> None:
    model = build_model("mlp", DATA.input_shape, 10, {"hidden": 32}, seed=1)
    offsets = [sum(batches[:i]) for i in range(len(batches) + 1)]
    x, y = DATA.train_x[: offsets[-1]], DATA.train_y[: offsets[-1]]
    acc = WeightedMean(sum(p.numel() for p in model.parameters()))
    grads = []
    for lo, hi in zip(offsets, offsets[1:]):
        grads.append(mean_gradient(model, x[lo:hi], y[lo:hi]))
        acc.add(grads[-1], hi - lo)
    expected = mean_gradient(model, x, y)
    assert torch.allclose(acc.result(), expected, atol=1e-5)
    assert torch.allclose(weighted_mean(grads, batches), expected, atol=1e-5)


def test_accumulator_resets_and_refuses_bad_batches() -> None:
    acc = WeightedMean(3)
    with pytest.raises(ValueError):
        acc.add(torch.ones(3), 0)
    with pytest.raises(ValueError):
        acc.result()
    acc.add(torch.ones(3), 2)
    acc.add(torch.zeros(3), 6)
    assert torch.allclose(acc.result(), torch.full((3,), 0.25))
    acc.reset()
    assert acc.weight == 0 and acc.count == 0


def test_asp_lr_scales_by_batch_share() -> None:
    assert asp_lr(0.4, 32, 128) == pytest.approx(0.1)
    assert asp_lr(0.4, 32, 128, scaling=False) == 0.4


def test_one_contribution_is_its_own_mean_and_is_held_until_reset() -> None:
    """A round with one gradient yields that gradient exactly (no b·g/b rounding) without copying it;
    the accumulator says it holds it until reset, and removing it or adding a second works as before."""
    g = torch.tensor([0.1, -3.0, 7.25])
    acc = WeightedMean(3)
    acc.add(g, 7)
    assert acc.holds(g) and acc.result() is g
    assert torch.equal(acc.partial_sum(), g * 7.0)
    acc.reset()
    assert not acc.holds(g) and torch.equal(g, torch.tensor([0.1, -3.0, 7.25]))
    acc.add(g, 3)
    acc.add(torch.ones(3), 1)
    assert not acc.holds(g)
    torch.testing.assert_close(acc.result(), (g * 3 + 1) / 4)
    acc.reset()
    acc.add(g, 2)
    with pytest.raises(ValueError, match="not added"):
        acc.remove(torch.ones(3), 2)
    acc.remove(g, 2)
    assert acc.count == 0 and acc.weight == 0 and not acc.holds(g)
    acc.add(torch.full((3,), 2.0), 5)
    assert torch.equal(acc.result(), torch.full((3,), 2.0))

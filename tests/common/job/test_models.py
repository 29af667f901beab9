"""Model options from the command line: a bad one is one ValueError naming it, never a torch traceback."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from common.job.models import build_model, check_takes


def exploding_model(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A user's factory that fails inside torch-like code (not with a TypeError or ValueError)."""
    raise RuntimeError("out of memory")


def narrow_input_model(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A user's model written for inputs of 10 features, whatever the dataset gives."""
    return nn.Sequential(nn.Flatten(), nn.Linear(10, num_classes))


def wrong_classes_model(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A user's model with three scores too many."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes + 3))


@pytest.mark.parametrize(
    ("name", "options", "needle"),
    [
        ("mlp", {"hidden": -1}, "hidden must be >= 1, got -1"),
        ("mlp", {"hidden": "wide"}, "hidden must be a whole number >= 1, got 'wide'"),
        ("mlp", {"layers": -2}, "layers must be >= 0"),
        ("mlp", {"depth": 3}, "has no option 'depth' (its options: hidden, layers)"),
        ("cnn", {"width": 0}, "width must be >= 1, got 0"),
        ("tests.common.job.test_models:exploding_model", {}, "out of memory"),
    ],
)
def test_bad_model_options_are_one_value_error_naming_the_option(name: str, options: dict, needle: str) -> None:
    with pytest.raises(ValueError, match="rejected its options|has no option") as caught:
        build_model(name, (1, 8, 8), 10, options, seed=0)
    assert needle in str(caught.value)


def test_whole_numbers_written_as_floats_still_build() -> None:
    model = build_model("mlp", (64,), 10, {"hidden": 16.0, "layers": 1}, seed=0)
    assert [m.out_features for m in model if isinstance(m, nn.Linear)] == [16, 10]


@pytest.mark.parametrize(("factory", "needle"), [
    (narrow_input_model, "cannot take the dataset's inputs of shape (1, 8, 8): RuntimeError: mat1 and mat2"),
    (wrong_classes_model, "must give one score per class for each sample, (2, 10) for 2 samples of a dataset of 10 "
                          "classes; it gave (2, 13)"),
])
def test_a_model_that_does_not_fit_the_data_is_one_value_error(factory, needle: str) -> None:
    with pytest.raises(ValueError) as caught:
        check_takes(factory((1, 8, 8), 10), "mine", torch.rand(2, 1, 8, 8), 10)
    assert needle in str(caught.value)


def test_the_check_changes_nothing_the_model_holds() -> None:
    model = build_model("cnn-bn", (1, 8, 8), 10, {}, seed=0).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    check_takes(model, "cnn-bn", torch.rand(2, 1, 8, 8) * 5, 10)
    assert model.training and all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())

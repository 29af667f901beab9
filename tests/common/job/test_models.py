"""Model options from the command line: a bad one is one ValueError naming it, never a torch traceback."""

from __future__ import annotations

import pytest
from torch import nn

from common.job.models import build_model


def exploding_model(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A user's factory that fails inside torch-like code (not with a TypeError or ValueError)."""
    raise RuntimeError("out of memory")


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

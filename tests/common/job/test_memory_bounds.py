"""The size of a model and a generated data set, estimated before they are built: exact for the
built-in models (built on the meta device), an upper bound of what a generated set draws, and a
refusal, naming the sizes, when they exceed the memory the caller says there is."""

from __future__ import annotations

import re
import time

import pytest

from common.job.datasets import build_dataset
from common.job.memory_bounds import MEMORY_FRACTION, MODEL_COPIES, check_fits, parameter_count
from common.job.models import MODELS, build_model

GIB = 1 << 30


@pytest.mark.parametrize(("name", "shape", "options"), [
    ("mlp", (1, 8, 8), {}), ("mlp", (32,), {"hidden": 300, "layers": 3}), ("mlp", (3, 16, 16), {"layers": 0}),
    ("cnn", (3, 32, 32), {"width": 8}), ("cnn", (1, 8, 8), {}), ("cnn-bn", (3, 16, 16), {"width": 12}),
])
def test_the_meta_count_is_the_built_models(name: str, shape: tuple[int, ...], options: dict) -> None:
    model = build_model(name, shape, 10, options, seed=0)
    built = sum(t.numel() for t in model.parameters()) + sum(t.numel() for t in model.buffers())
    assert parameter_count(lambda: MODELS[name](shape, 10, **options)) == built


def test_a_model_in_range_but_beyond_the_memory_is_refused_before_it_is_built() -> None:
    start = time.monotonic()
    with pytest.raises(ValueError) as caught:
        build_model("mlp", (3, 32, 32), 10, {"hidden": 16384, "layers": 64}, seed=0, memory_bytes=64 * GIB)
    said = str(caught.value)
    assert said.startswith("model 'mlp' with options {'hidden': 16384, 'layers': 64} on inputs of shape (3, 32, 32) needs about")
    assert "16,962,977,802 values, 16 bytes each" in said and "more than 80% of the 64.0 GiB of memory available here" in said
    assert time.monotonic() - start < 5  # no 253 GiB allocated: built on the meta device


def test_a_model_that_fits_is_built_and_no_memory_given_checks_nothing() -> None:
    small = build_model("mlp", (1, 8, 8), 10, {"hidden": 16}, seed=0, memory_bytes=GIB)
    assert sum(p.numel() for p in small.parameters()) == 64 * 16 + 16 + 16 * 16 + 16 + 16 * 10 + 10
    with pytest.raises(ValueError, match="more than 80% of the 0.0 GiB"):
        build_model("mlp", (1, 8, 8), 10, {"hidden": 16}, seed=0, memory_bytes=1000.0)
    build_model("mlp", (1, 8, 8), 10, {"hidden": 16}, seed=0, memory_bytes=None)


def test_check_fits_takes_up_to_the_fraction_and_refuses_beyond_it() -> None:
    values = 1000
    enough = 4 * values * MODEL_COPIES / MEMORY_FRACTION
    check_fits("m", values, MODEL_COPIES, enough)
    with pytest.raises(ValueError, match="^m needs about"):
        check_fits("m", values, MODEL_COPIES, enough * 0.99)


@pytest.mark.parametrize(("name", "options"), [
    ("synthetic", {"size": 64, "image_size": 8}), ("patterns", {"size": 64, "image_size": 8, "channels": 2}),
    ("teacher", {"size": 64, "features": 8, "hidden": 4}),
])
def test_a_generated_sets_estimate_covers_what_it_holds_and_refuses_beyond_memory(name: str, options: dict) -> None:
    data = build_dataset(name, options, seed=0, memory_bytes=GIB)
    held = sum(t.numel() for t in (data.train_x, data.test_x))
    with pytest.raises(ValueError, match=f"^dataset '{name}' with options .* needs about") as caught:
        build_dataset(name, options, seed=0, memory_bytes=held * 4.0)  # the draw alone exceeds 80% of it
    counted = re.search(r"\(([\d,]+) values", str(caught.value))
    assert counted is not None and int(counted.group(1).replace(",", "")) >= held


def test_a_huge_generated_set_is_refused_before_it_is_drawn() -> None:
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"dataset 'synthetic' with options .* needs about .* GiB"):
        build_dataset("synthetic", {"size": 2**24, "image_size": 1024, "channels": 64}, seed=0, memory_bytes=64 * GIB)
    assert time.monotonic() - start < 1

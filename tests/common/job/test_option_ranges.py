"""The declared ranges of the built-in models' and data sets' options: every value outside one is a
ValueError naming the factory, the option, its range and the value, before the factory runs; every
declared option is one the factory takes, and its default lies in its range."""

from __future__ import annotations

import inspect
import math
import time

import pytest

from common.job.datasets import DATASET_RANGES, DATASETS, build_dataset
from common.job.models import MODEL_RANGES, MODELS, build_model
from common.job.option_ranges import FRACTION, SCALE, Bound, check_ranges


def test_a_bound_takes_its_ends_and_refuses_past_them_naming_all() -> None:
    layers = Bound(0, 64)
    for value in (0, 64, 3.0):
        layers.check("layers", value)
    with pytest.raises(ValueError, match=r"^layers must be in \[0, 64\], got 3000000$"):
        layers.check("layers", 3000000)
    with pytest.raises(ValueError, match=r"^layers must be >= 0, got -1 \(its range: \[0, 64\]\)$"):
        layers.check("layers", -1)
    with pytest.raises(ValueError, match=r"layers must be a whole number >= 0, got 'deep' \(its range: \[0, 64\]\)"):
        layers.check("layers", "deep")
    with pytest.raises(ValueError, match=r"^test_fraction must be in \(0, 1\), got 1$"):
        FRACTION.check("test_fraction", 1)
    with pytest.raises(ValueError, match=r"noise must be a finite number, got nan \(its range: \[0, inf\]\)"):
        SCALE.check("noise", math.nan)


def test_check_ranges_names_the_factory_and_leaves_undeclared_options_alone() -> None:
    check_ranges("model", "mine", {"depth": 10**9}, {})
    with pytest.raises(ValueError, match=r"^model 'mlp' rejected its options \{'hidden': 60000\}: hidden must be in \[1, 16384\], got 60000$"):
        check_ranges("model", "mlp", {"hidden": 60000}, MODEL_RANGES["mlp"])


@pytest.mark.parametrize(("table", "factories", "fixed"), [(MODEL_RANGES, MODELS, 2), (DATASET_RANGES, DATASETS, 1)],
                         ids=["models", "datasets"])
def test_every_built_in_declares_its_numeric_options_and_their_defaults_are_in_range(table, factories, fixed) -> None:
    assert set(table) == set(factories)
    for name, factory in factories.items():
        parameters = list(inspect.signature(factory).parameters.values())[fixed:]
        numeric = {p.name: p.default for p in parameters if isinstance(p.default, (int, float)) and not isinstance(p.default, bool)}
        assert set(table[name]) == set(numeric), name
        for option, default in numeric.items():
            table[name][option].check(option, default)


@pytest.mark.parametrize(("name", "options", "needle"), [
    ("mlp", {"layers": 3000000}, "layers must be in [0, 64], got 3000000"),
    ("mlp", {"hidden": 60000}, "hidden must be in [1, 16384], got 60000"),
    ("cnn", {"width": 10**6}, "width must be in [1, 1024], got 1000000"),
    ("cnn-bn", {"width": 4096}, "width must be in [1, 1024], got 4096"),
])
def test_a_model_option_out_of_range_is_refused_in_milliseconds(name: str, options: dict, needle: str) -> None:
    start = time.process_time()
    with pytest.raises(ValueError, match=f"model '{name}' rejected its options") as caught:
        build_model(name, (1, 8, 8), 10, options, seed=0)
    assert needle in str(caught.value) and time.process_time() - start < 0.05


@pytest.mark.parametrize(("name", "options", "needle"), [
    ("synthetic", {"size": 2**30}, "size must be in [2, 16777216], got 1073741824"),
    ("synthetic", {"image_size": 100000}, "image_size must be in [4, 1024]"),
    ("patterns", {"channels": 1000}, "channels must be in [1, 64]"),
    ("teacher", {"features": 10**7}, "features must be in [1, 65536]"),
    ("image_folder", {"root": "/nowhere", "padding": 10**6}, "padding must be in [0, 1024]"),
])
def test_a_dataset_option_out_of_range_is_refused_before_anything_is_drawn(name: str, options: dict, needle: str) -> None:
    start = time.process_time()
    with pytest.raises(ValueError, match=f"dataset '{name}' rejected its options") as caught:
        build_dataset(name, options, seed=0)
    assert needle in str(caught.value) and time.process_time() - start < 0.05

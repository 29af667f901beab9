"""The built-in `patterns` task (common/job/datasets.py): seeded, valid options only, and hard
enough that a small CNN has not solved it after two epochs, where it solves `synthetic`."""

from __future__ import annotations

import pytest
import torch

from common.job.datasets import build_dataset
from common.job.models import build_model


def test_the_same_seed_gives_the_same_samples_and_another_seed_others() -> None:
    a, b = build_dataset("patterns", {"size": 512}, 3), build_dataset("patterns", {"size": 512}, 3)
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.train_y, b.train_y)
    assert torch.equal(a.test_x, b.test_x) and torch.equal(a.test_y, b.test_y)
    c = build_dataset("patterns", {"size": 512}, 4)
    assert not torch.equal(a.train_x, c.train_x)
    assert a.input_shape == (3, 32, 32) and a.num_classes == 10
    assert len(a.test_x) == round(512 * 0.2) and a.train_x.dtype == torch.float32 and a.train_y.dtype == torch.int64
    assert set(a.train_y.tolist()) == set(range(10))


def test_label_noise_touches_training_labels_only() -> None:
    clean = build_dataset("patterns", {"size": 2048, "label_noise": 0.0}, 0)
    noisy = build_dataset("patterns", {"size": 2048, "label_noise": 0.5}, 0)
    assert torch.equal(clean.test_y, noisy.test_y) and torch.equal(clean.train_x, noisy.train_x)
    changed = (clean.train_y != noisy.train_y).float().mean().item()
    assert 0.35 < changed < 0.55  # half replaced, a tenth of those by the same class


@pytest.mark.parametrize(("options", "needle"), [
    ({"shift": -1}, "shift"), ({"separation": -0.5}, "separation"), ({"label_noise": 1.5}, "label_noise"),
    ({"size": 1}, "size"), ({"colour": 2}, "colour"),
])
def test_bad_options_are_one_error_naming_them(options: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        build_dataset("patterns", options, 0)


def accuracy_after(dataset: str, epochs: int) -> float:
    """The server's defaults (SGD, lr 0.02, momentum 0.9) on one process: the CNN's test accuracy."""
    torch.manual_seed(0)
    data = build_dataset(dataset, {"size": 2048}, 0)
    model = build_model("cnn", data.input_shape, data.num_classes, {}, 0)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    loader = torch.utils.data.DataLoader(data.train, batch_size=128, shuffle=True)
    for _ in range(epochs):
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    with torch.no_grad():
        return (model(data.test_x).argmax(1) == data.test_y).float().mean().item()


def test_a_small_cnn_has_not_solved_patterns_after_two_epochs_where_it_solves_synthetic() -> None:
    assert accuracy_after("synthetic", 2) > 0.9
    assert accuracy_after("patterns", 2) < 0.6

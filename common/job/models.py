"""Built-in models. A model factory takes (input_shape, num_classes, **options) -> nn.Module.

Every built-in declares the range of its options (MODEL_RANGES), checked before it runs, and its size
is estimated before it is built when the caller says how much memory there is (common.job.memory_bounds)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from common.job.memory_bounds import MODEL_COPIES, check_fits, parameter_count
from common.job.option_ranges import Bound, check_ranges
from common.job.registry import built, check_options, resolve
from common.number_checks import whole


def mlp(input_shape: tuple[int, ...], num_classes: int, hidden: int = 128, layers: int = 2) -> nn.Module:
    """A ReLU MLP on the flattened input; ``hidden`` can be raised to make a wide (large) model."""
    dims = [math.prod(input_shape)] + [whole("hidden", hidden, 1)] * whole("layers", layers, 0)
    body: list[nn.Module] = [nn.Flatten()]
    for d_in, d_out in zip(dims, dims[1:]):
        body += [nn.Linear(d_in, d_out), nn.ReLU()]
    body.append(nn.Linear(dims[-1], num_classes))
    return nn.Sequential(*body)


class SmallCNN(nn.Module):
    """Two conv blocks and a linear head; works for 8x8 (digits) and 32x32 inputs."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, width: int = 32) -> None:
        super().__init__()
        channels, height, width_px = input_shape
        w = whole("width", width, 1)
        self.features = nn.Sequential(
            nn.Conv2d(channels, w, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(w, 2 * w, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        flat = 2 * w * (height // 4) * (width_px // 4)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(flat, 128), nn.ReLU(), nn.Linear(128, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.features(x))
        return out


def cnn(input_shape: tuple[int, ...], num_classes: int, width: int = 32) -> nn.Module:
    """The small CNN; needs (channels, height, width) inputs."""
    if len(input_shape) != 3:
        raise ValueError(f"cnn needs image inputs (C, H, W); the dataset gives shape {input_shape}")
    return SmallCNN(input_shape, num_classes, width)


class BatchNormCNN(nn.Module):
    """The small CNN with BatchNorm after each convolution and before the head's ReLU: its training
    normalises over the worker's batch, so a tiny batch changes what it learns (docs/micro-batches.md)."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, width: int = 16) -> None:
        super().__init__()
        channels, height, width_px = input_shape
        w = whole("width", width, 1)
        self.features = nn.Sequential(
            nn.Conv2d(channels, w, 3, padding=1, bias=False),
            nn.BatchNorm2d(w),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(w, 2 * w, 3, padding=1, bias=False),
            nn.BatchNorm2d(2 * w),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        flat = 2 * w * (height // 4) * (width_px // 4)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(flat, 64, bias=False), nn.BatchNorm1d(64), nn.ReLU(),
                                  nn.Linear(64, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.features(x))
        return out


def cnn_bn(input_shape: tuple[int, ...], num_classes: int, width: int = 16) -> nn.Module:
    """The BatchNorm CNN; needs (channels, height, width) inputs."""
    if len(input_shape) != 3:
        raise ValueError(f"cnn-bn needs image inputs (C, H, W); the dataset gives shape {input_shape}")
    return BatchNormCNN(input_shape, num_classes, width)


MODELS: dict[str, Callable[..., nn.Module]] = {"mlp": mlp, "cnn": cnn, "cnn-bn": cnn_bn}
MODEL_RANGES: dict[str, dict[str, Bound]] = {
    "mlp": {"hidden": Bound(1, 16384), "layers": Bound(0, 64)},
    "cnn": {"width": Bound(1, 1024)},
    "cnn-bn": {"width": Bound(1, 1024)},
}
"""The range of every built-in's options: wide enough for any model these workers train (the widest
in the benchmarks is hidden=2048), narrow enough that no single option asks for an unbuildable one."""


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, options: dict[str, Any], seed: int,
                allowed: Sequence[str] | None = None, memory_bytes: float | None = None) -> nn.Module:
    """Build a model with seeded initial weights, so every process gets the same model; a factory
    path only from a module `allowed` admits (common.job.registry.resolve). A built-in's options must
    lie in their ranges, and with `memory_bytes` (what this process has) its estimated size must fit
    in it (common.job.memory_bounds), both checked before it is built."""
    factory = resolve(name, MODELS, "model", allowed)
    check_options("model", name, factory, options, fixed=2)
    if name in MODELS:
        check_ranges("model", name, options, MODEL_RANGES[name])
        if memory_bytes is not None:
            count = built("model", name, options, lambda: parameter_count(
                lambda: factory(tuple(input_shape), num_classes, **options)))
            check_fits(f"model {name!r} with options {options} on inputs of shape {tuple(input_shape)}", count,
                       MODEL_COPIES, memory_bytes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = built("model", name, options, lambda: factory(tuple(input_shape), num_classes, **options))
    if not isinstance(model, nn.Module):
        raise ValueError(f"model factory {name!r} returned {type(model).__name__}, not an nn.Module")
    return model


def check_takes(model: nn.Module, name: str, inputs: torch.Tensor, num_classes: int) -> None:
    """ValueError unless `model` maps `inputs` (a few of the dataset's samples) to one score per class
    for each: a model that does not fit the data fails here, where the job is set up, with words that
    say so, not in every worker's first step. Run in eval mode without gradients, so nothing the model
    holds changes (BatchNorm's running statistics included)."""
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(inputs)
    except Exception as exc:  # the user's forward: any error it raises is the model's
        raise ValueError(f"model {name!r} cannot take the dataset's inputs of shape {tuple(inputs.shape[1:])}: "
                         f"{type(exc).__name__}: {exc}") from exc
    finally:
        model.train(training)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (len(inputs), num_classes):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"model {name!r} must give one score per class for each sample, "
                         f"({len(inputs)}, {num_classes}) for {len(inputs)} samples of a dataset of {num_classes} "
                         f"classes; it gave {got}")

"""What a job may ask of a process's memory: the bytes of its model and data set, estimated before
either is built, refused when they exceed MEMORY_FRACTION of the memory the process has.

Option ranges (common.job.option_ranges) bound each number, not their product: `hidden=16384,
layers=64` is in range and still 17 billion parameters. The model's parameter count is found by
building it on torch's meta device, which allocates nothing and takes milliseconds at the ranges'
bounds; a generated data set's size follows from its options (common.job.datasets.GENERATED_VALUES).
The caller gives the memory (common.ops.available_memory for this process); with none, nothing is
checked. Only built-in factories are estimated: a user's factory path runs once, when it is built.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

MEMORY_FRACTION = 0.8
"""The share of the available memory a job's model or data set may take."""
MODEL_COPIES = 4
"""fp32 values a process holds per parameter at least: the module's parameters, their gradients, the
flat vector the wire reads and writes, and the optimizer's state or a reply's buffer."""
DATA_COPIES = 2
"""fp32 values a generated data set holds per sample value at its peak: the draw and what it is summed with."""
GIB = float(1 << 30)


def parameter_count(build: Callable[[], nn.Module]) -> int:
    """The parameters and buffers of the module `build()` makes, built on the meta device (no memory)."""
    with torch.device("meta"):
        module = build()
    if not isinstance(module, nn.Module):
        return 0  # the real build says what is wrong with it
    return sum(t.numel() for t in module.parameters()) + sum(t.numel() for t in module.buffers())


def check_fits(what: str, values: int, copies: int, memory_bytes: float | None) -> None:
    """ValueError when `values` fp32 values, held `copies` times, exceed MEMORY_FRACTION of
    `memory_bytes` (None: not checked). `what` names the model or data set and its options."""
    if memory_bytes is None:
        return
    need = 4.0 * values * copies
    if need > MEMORY_FRACTION * memory_bytes:
        raise ValueError(f"{what} needs about {need / GIB:,.1f} GiB ({values:,} values, {4 * copies} bytes each), more "
                         f"than {MEMORY_FRACTION:.0%} of the {memory_bytes / GIB:,.1f} GiB of memory available here")

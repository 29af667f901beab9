"""The model's parameters as one flat vector: the layout (names, shapes, dtypes) fixed at Join, and
the copies between a model and its flat fp32 vector.

Pure: no I/O. The wire codec (common/transport/wire.py) moves such flat vectors as chunks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class TensorEntry:
    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Layout:
    """Order and shapes of the model's parameters inside the flat buffer."""

    entries: tuple[TensorEntry, ...]

    @property
    def numel(self) -> int:
        return sum(e.numel for e in self.entries)

    @classmethod
    def of(cls, model: nn.Module) -> Layout:
        return cls(tuple(TensorEntry(n, tuple(p.shape), str(p.dtype).removeprefix("torch.")) for n, p in model.named_parameters()))

    def matches(self, model: nn.Module) -> bool:
        return self == Layout.of(model)

    def difference(self, other: Layout) -> str:
        """Where `other` (a peer's) first differs from this one, in words ("" where they are the same)."""
        for index, (own, theirs) in enumerate(zip(self.entries, other.entries)):
            if own != theirs:
                return (f"tensor {index} is {theirs.name[:80]!r} {list(theirs.shape)} {theirs.dtype[:20]} there, "
                        f"{own.name!r} {list(own.shape)} {own.dtype} here")
        if len(self.entries) != len(other.entries):
            return f"{len(other.entries)} tensors there, {len(self.entries)} here"
        return ""


def flatten_params(model: nn.Module) -> torch.Tensor:
    """All parameters as one new contiguous fp32 vector."""
    return torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])


def flatten_grads(model: nn.Module, out: torch.Tensor | None = None) -> torch.Tensor:
    """All gradients as one contiguous fp32 vector (zeros where a parameter has no grad)."""
    params = list(model.parameters())
    out = torch.empty(sum(p.numel() for p in params)) if out is None else out
    offset = 0
    for p in params:
        n = p.numel()
        if p.grad is None:
            out[offset : offset + n].zero_()
        else:
            out[offset : offset + n].copy_(p.grad.reshape(-1))
        offset += n
    return out


def load_flat(model: nn.Module, flat: torch.Tensor) -> None:
    """Make the model's parameters views of the flat vector (parameters of its dtype: no copy, so
    values decoded into `flat` later are in the model at once); a parameter of another dtype gets a
    converted copy and keeps its dtype (the model's Layout stays the same)."""
    params = list(model.parameters())
    if all(p.dtype == flat.dtype for p in params):
        torch.nn.utils.vector_to_parameters(flat, params)
        return
    offset = 0
    for p in params:
        n = p.numel()
        p.data = flat[offset : offset + n].view_as(p).to(p.dtype)
        offset += n

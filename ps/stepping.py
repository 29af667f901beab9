"""How the parameter store steps its optimizer a piece (a range of the flat vector) at a time.

Two ways, one interface (`Stepper`):
- `SGDSteps`: SGD (momentum, dampening, Nesterov, weight decay, maximize) written out as torch's
  single-tensor SGD computes it, on views of one optimizer's parameter and momentum buffer. A piece
  costs a few torch calls (~10 us), so pieces can be as small as one wire chunk: the framing of a
  reply then reads each piece's new values while they are still in cache.
- `TorchPieces`: any torch optimizer (Adam), one per piece of `PIECE_VALUES` values (an
  `Optimizer.step` costs ~50 us of Python, so its pieces stay large).

Both act value by value, so stepping the pieces one after another equals stepping the whole vector
(bit for bit: piece sizes are multiples of every SIMD width, so only the last piece has a scalar
tail, the one the whole vector would have). The state a checkpoint holds is one torch optimizer's
over the whole vector either way.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn

from ps.jobspec import JobSpec
from ps.shard_ranges import merge_optimizer_states, slice_optimizer_state
from ps.wire import CHUNK_BYTES

# torch.optim pieces: 4 Mi values (16 MiB) step in ~1-2 ms; a 100 M model has 24 of them
PIECE_VALUES = 1 << 22
# SGD pieces: one fp32 wire chunk (1 MiB), so a reply's chunk is framed from a piece just stepped
SGD_PIECE_VALUES = CHUNK_BYTES // 4

Range = tuple[int, int]


def make_optimizer(params: list[nn.Parameter], spec: JobSpec) -> torch.optim.Optimizer:
    if spec.optimizer == "adam":
        return torch.optim.Adam(params, lr=spec.lr, weight_decay=spec.weight_decay)
    return torch.optim.SGD(
        params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay, nesterov=spec.nesterov
    )


def piece_ranges(numel: int, piece_values: int) -> list[Range]:
    if piece_values < 1:
        raise ValueError(f"piece_values must be >= 1, got {piece_values}")
    return [(start, min(start + piece_values, numel)) for start in range(0, max(numel, 1), piece_values)]


def copy_state(state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state dict whose tensors are copies: torch's `state_dict` hands out the live
    buffers and its `load_state_dict` keeps the caller's, so without a copy a checkpoint (or a second
    store loaded from it) would change as the optimizer steps."""
    return {
        "state": {key: {name: value.clone() if isinstance(value, torch.Tensor) else value for name, value in per.items()}
                  for key, per in state["state"].items()},
        "param_groups": [dict(group) for group in state["param_groups"]],
    }


class Stepper(Protocol):
    """Steps the optimizer over `flat` one piece at a time: `begin`, `step_piece` for every piece in
    order, `end`. Between `begin` and `end` nothing else may touch the optimizer."""

    pieces: list[Range]

    @property
    def lr(self) -> float: ...

    def set_lr(self, lr: float) -> None: ...

    def begin(self) -> None: ...

    def step_piece(self, index: int, grad: torch.Tensor) -> None: ...

    def end(self) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def make_stepper(flat: torch.Tensor, spec: JobSpec, piece_values: int | None = None) -> Stepper:
    """The stepper for the job's optimizer over `flat` (stepped in place)."""
    if spec.optimizer == "sgd":
        return SGDSteps(flat, spec, SGD_PIECE_VALUES if piece_values is None else piece_values)
    return TorchPieces(flat, spec, PIECE_VALUES if piece_values is None else piece_values)


class SGDSteps:
    """torch.optim.SGD's arithmetic on ranges of one optimizer's parameter (the whole vector).

    The optimizer holds the hyperparameters and the momentum buffer (and gives the checkpoint
    format); its own `step` is never called. The first step with momentum starts the buffer as a
    copy of the gradient, as torch does."""

    def __init__(self, flat: torch.Tensor, spec: JobSpec, piece_values: int) -> None:
        self._param = nn.Parameter(flat, requires_grad=False)  # shares flat's memory
        self.optimizer = make_optimizer([self._param], spec)
        self.pieces = piece_ranges(flat.numel(), piece_values)
        self._buffer: torch.Tensor | None = None
        self._fresh = False
        self._group: dict[str, Any] = {}

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def set_lr(self, lr: float) -> None:
        self.optimizer.param_groups[0]["lr"] = lr

    def begin(self) -> None:
        self._group = self.optimizer.param_groups[0]
        self._buffer, self._fresh = None, False
        if self._group["momentum"] != 0:
            self._buffer = self.optimizer.state[self._param].get("momentum_buffer")
            if self._buffer is None:
                self._buffer, self._fresh = torch.empty_like(self._param.data), True

    @torch.no_grad()
    def step_piece(self, index: int, grad: torch.Tensor) -> None:
        start, stop = self.pieces[index]
        group, param = self._group, self._param.data[start:stop]
        if group["maximize"]:
            grad = -grad
        if group["weight_decay"] != 0:
            grad = grad.add(param, alpha=group["weight_decay"])
        momentum = group["momentum"]
        if momentum != 0:
            assert self._buffer is not None
            buf = self._buffer[start:stop]
            if self._fresh:
                buf.copy_(grad)
            else:
                buf.mul_(momentum).add_(grad, alpha=1 - group["dampening"])
            grad = grad.add(buf, alpha=momentum) if group["nesterov"] else buf
        param.add_(grad, alpha=-group["lr"])

    def end(self) -> None:
        if self._buffer is not None:
            self.optimizer.state[self._param]["momentum_buffer"] = self._buffer
        self._buffer, self._fresh = None, False

    def state_dict(self) -> dict[str, Any]:
        return copy_state(self.optimizer.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(copy_state(state))


class TorchPieces:
    """One torch optimizer per piece, over views of `flat`."""

    def __init__(self, flat: torch.Tensor, spec: JobSpec, piece_values: int) -> None:
        self.pieces = piece_ranges(flat.numel(), piece_values)
        self._numel = flat.numel()
        self._params = [nn.Parameter(flat[start:stop]) for start, stop in self.pieces]  # views: no copy
        self._optimizers = [make_optimizer([p], spec) for p in self._params]

    @property
    def lr(self) -> float:
        return float(self._optimizers[0].param_groups[0]["lr"])

    def set_lr(self, lr: float) -> None:
        for optimizer in self._optimizers:
            for group in optimizer.param_groups:
                group["lr"] = lr

    def begin(self) -> None:
        pass

    def step_piece(self, index: int, grad: torch.Tensor) -> None:
        param = self._params[index]
        param.grad = grad if grad.dtype == param.dtype else grad.float()  # a bf16/fp16 push's chunk
        self._optimizers[index].step()
        param.grad = None

    def end(self) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        states = [optimizer.state_dict() for optimizer in self._optimizers]
        return copy_state(states[0]) if len(states) == 1 else merge_optimizer_states(states, self.pieces)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(self._optimizers) == 1:
            self._optimizers[0].load_state_dict(copy_state(state))
            return
        for optimizer, (start, stop) in zip(self._optimizers, self.pieces, strict=True):
            optimizer.load_state_dict(slice_optimizer_state(state, self._numel, start, stop))

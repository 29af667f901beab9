"""How the parameter store steps its optimizer a piece (a range of the flat vector) at a time.

Two ways, one interface (`Stepper`):
- `SGDSteps`: SGD (momentum, dampening, Nesterov, weight decay, maximize) written out as torch's
  single-tensor SGD computes it, on views of the vector and of its own momentum buffer. A piece
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
    """torch.optim.SGD's arithmetic on ranges of the whole vector.

    It keeps SGD's hyperparameters and momentum buffer itself and reads and writes torch.optim.SGD's
    state dict (one parameter, index 0), so checkpoints load in either. It builds no torch optimizer:
    the first torch optimizer a process builds imports torch._dynamo (~1.5 s of CPU, ~12 s for a
    fast-path worker on a 1/8-core quota). The first step with momentum starts the buffer as a copy
    of the gradient, as torch does."""

    def __init__(self, flat: torch.Tensor, spec: JobSpec, piece_values: int) -> None:
        self._flat = flat
        self.pieces = piece_ranges(flat.numel(), piece_values)
        self._group: dict[str, Any] = sgd_group(spec)
        self._momentum_buffer: torch.Tensor | None = None  # torch's state["momentum_buffer"]
        self._fresh = False  # this step starts the buffer (copies the gradient into it)

    @property
    def lr(self) -> float:
        return float(self._group["lr"])

    def set_lr(self, lr: float) -> None:
        self._group["lr"] = lr

    def begin(self) -> None:
        self._fresh = self._group["momentum"] != 0 and self._momentum_buffer is None
        if self._fresh:
            self._momentum_buffer = torch.empty_like(self._flat)

    @torch.no_grad()
    def step_piece(self, index: int, grad: torch.Tensor) -> None:
        start, stop = self.pieces[index]
        group, param = self._group, self._flat[start:stop]
        if group["maximize"]:
            grad = -grad
        if group["weight_decay"] != 0:
            grad = grad.add(param, alpha=group["weight_decay"])
        momentum = group["momentum"]
        if momentum != 0:
            assert self._momentum_buffer is not None
            buf = self._momentum_buffer[start:stop]
            if self._fresh:
                buf.copy_(grad)
            else:
                buf.mul_(momentum).add_(grad, alpha=1 - group["dampening"])
            grad = grad.add(buf, alpha=momentum) if group["nesterov"] else buf
        param.add_(grad, alpha=-group["lr"])

    def end(self) -> None:
        self._fresh = False

    def state_dict(self) -> dict[str, Any]:
        state = {} if self._momentum_buffer is None else {0: {"momentum_buffer": self._momentum_buffer.clone()}}
        return {"state": state, "param_groups": [dict(self._group)]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take a torch.optim.SGD state dict over one parameter of this vector's size (as torch does,
        the saved hyperparameters replace the job's); a malformed one is a ValueError and changes nothing."""
        groups = state.get("param_groups") if isinstance(state, dict) else None
        per_param = state.get("state") if isinstance(state, dict) else None
        if not (isinstance(groups, list) and len(groups) == 1 and isinstance(groups[0], dict) and isinstance(per_param, dict)):
            raise ValueError("an SGD state dict has one parameter group and a per-parameter state")
        if set(per_param) - {0} or not isinstance(per_param.get(0, {}), dict):
            raise ValueError(f"an SGD state dict of one parameter has state for {sorted(map(str, per_param))}")
        buffer = per_param.get(0, {}).get("momentum_buffer")
        if buffer is not None:
            if not isinstance(buffer, torch.Tensor) or not buffer.is_floating_point() or buffer.numel() != self._flat.numel():
                raise ValueError(f"the momentum buffer must be a float tensor of {self._flat.numel()} values")
            buffer = buffer.detach().reshape(-1).to(self._flat.dtype, copy=True)
        group = {**self._group, **{k: v for k, v in groups[0].items() if k != "params"}, "params": [0]}
        self._group, self._momentum_buffer = group, buffer


def sgd_group(spec: JobSpec) -> dict[str, Any]:
    """The parameter group torch.optim.SGD builds for the job's hyperparameters (key order included)."""
    return {"lr": spec.lr, "momentum": spec.momentum, "dampening": 0, "weight_decay": spec.weight_decay,
            "nesterov": spec.nesterov, "maximize": False, "foreach": None, "differentiable": False,
            "fused": None, "params": [0]}


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

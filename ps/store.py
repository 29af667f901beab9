"""The parameter store: one contiguous fp32 tensor of all parameters and a torch optimizer over it.

The optimizer steps the vector a piece at a time (`PIECE_VALUES` values, one torch optimizer per
piece over a view of the same tensor): SGD and Adam act value by value, so the pieces stepped one
after another equal the vector stepped whole. That lets a step be deferred (`begin_step`) and
applied only as far as a reader needs (`values`): a reply streams its first chunks while the later
pieces are still to be stepped, instead of waiting for the whole step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ps.jobspec import JobSpec
from ps.shard_ranges import merge_optimizer_states, slice_optimizer_state
from ps.wire import flatten_params

# 4 Mi values (16 MiB): a piece steps in ~1-2 ms, and a 100 M model has 24 pieces (one optimizer
# call each, ~50 us of Python apiece). A multiple of every SIMD width, so only the last piece has a
# scalar tail, the same one the whole vector would have: piece-wise and whole steps agree bit for bit.
PIECE_VALUES = 1 << 22


def make_optimizer(params: list[nn.Parameter], spec: JobSpec) -> torch.optim.Optimizer:
    if spec.optimizer == "adam":
        return torch.optim.Adam(params, lr=spec.lr, weight_decay=spec.weight_decay)
    return torch.optim.SGD(
        params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay, nesterov=spec.nesterov
    )


class ParameterStore:
    """Global model state. BSP steps the optimizer with an aggregated gradient; ASP adds updates.

    `before_change` callbacks run before the values change (a step begins, an update, a load), so
    a reader that is still framing the current values (ps.payload) can finish first.
    """

    def __init__(self, flat: torch.Tensor, spec: JobSpec, piece_values: int | None = None) -> None:
        """A store over a copy of `flat` (all parameters, or one shard's range of them), stepped in
        pieces of `piece_values` values (default PIECE_VALUES)."""
        piece_values = PIECE_VALUES if piece_values is None else piece_values
        if piece_values < 1:
            raise ValueError(f"piece_values must be >= 1, got {piece_values}")
        self._flat = flat.detach().reshape(-1).float().clone()
        n = self._flat.numel()
        self.pieces = [(start, min(start + piece_values, n)) for start in range(0, max(n, 1), piece_values)]
        self._params = [nn.Parameter(self._flat[start:stop]) for start, stop in self.pieces]  # views: no copy
        self._optimizers = [make_optimizer([p], spec) for p in self._params]
        self._pending: torch.Tensor | None = None  # the gradient of a step begun and not yet fully applied
        self._next_piece = 0
        self.before_change: list[Callable[[], None]] = []

    @classmethod
    def of_model(cls, model: nn.Module, spec: JobSpec) -> ParameterStore:
        return cls(flatten_params(model), spec)

    @property
    def flat(self) -> torch.Tensor:
        """All values, with any deferred step applied. Change them only through this class's methods."""
        self.settle()
        return self._flat

    @property
    def numel(self) -> int:
        return self._flat.numel()

    @property
    def lr(self) -> float:
        return float(self._optimizers[0].param_groups[0]["lr"])

    def set_lr(self, lr: float) -> None:
        self.settle()  # a deferred step keeps the learning rate it began with
        for optimizer in self._optimizers:
            for group in optimizer.param_groups:
                group["lr"] = lr

    def values(self, start: int, stop: int) -> torch.Tensor:
        """Values [start, stop), stepped as far as they need to be (a view: read it before the next change)."""
        self.settle(stop)
        return self._flat[start:stop]

    def begin_step(self, grad: torch.Tensor) -> None:
        """θ ← optimizer_step(θ, g), applied piece by piece as values are read (`values`, `flat`,
        `settle`). The caller must leave `grad` unchanged until `settle()` has run."""
        self._changing()
        self._pending, self._next_piece = grad, 0

    def settle(self, stop: int | None = None) -> None:
        """Apply the deferred step to every piece that holds a value before `stop` (default: all)."""
        grad = self._pending
        if grad is None:
            return
        stop = self.numel if stop is None else stop
        while self._next_piece < len(self.pieces) and self.pieces[self._next_piece][0] < stop:
            start, end = self.pieces[self._next_piece]
            param = self._params[self._next_piece]
            param.grad = grad[start:end]
            self._optimizers[self._next_piece].step()
            param.grad = None
            self._next_piece += 1
        if self._next_piece == len(self.pieces):
            self._pending = None

    def apply_gradient(self, grad: torch.Tensor) -> None:
        """θ ← optimizer_step(θ, g), at once."""
        self.begin_step(grad)
        self.settle()

    @torch.no_grad()
    def apply_update(self, delta: torch.Tensor) -> None:
        """θ ← θ + Δ (ASP: Δ is already scaled by the worker's learning rate)."""
        self._changing()
        self._flat.add_(delta)

    @torch.no_grad()
    def assign(self, values: torch.Tensor) -> None:
        """θ ← values (a snapshot from the collective fast path; a broadcast)."""
        self._changing()
        self._flat.copy_(values.reshape(-1))

    def snapshot(self) -> torch.Tensor:
        return self.flat.clone()

    def optimizer_state(self) -> dict[str, Any]:
        """The optimizer's state as one optimizer over the whole vector would have it (a checkpoint
        resumes with any piece size or shard count)."""
        self.settle()
        states = [optimizer.state_dict() for optimizer in self._optimizers]
        return states[0] if len(states) == 1 else merge_optimizer_states(states, self.pieces)

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        self._changing()
        if len(self._optimizers) == 1:
            self._optimizers[0].load_state_dict(state)
            return
        for optimizer, (start, stop) in zip(self._optimizers, self.pieces, strict=True):
            optimizer.load_state_dict(slice_optimizer_state(state, self.numel, start, stop))

    def state_dict(self) -> dict:
        return {"params": self.snapshot(), "optimizer": self.optimizer_state()}

    def load_state_dict(self, state: dict) -> None:
        params = state["params"]
        if params.shape != self._flat.shape:
            raise ValueError(f"checkpoint has {params.numel()} parameters, the model has {self.numel}")
        self.assign(params)
        self.load_optimizer_state(state["optimizer"])

    def _changing(self) -> None:
        """Before the values change: finish a deferred step, then let readers of the current values finish."""
        self.settle()
        for callback in self.before_change:
            callback()

"""The parameter store: one contiguous fp32 tensor of all parameters and a torch optimizer over it.

The optimizer steps the vector a piece at a time (ps.params.stepping): SGD and Adam act value by value, so
the pieces stepped one after another equal the vector stepped whole. That lets a step be deferred
(`begin_step`) and applied only as far as a reader needs (`values_into`): a reply streams its first
chunks while the later pieces are still to be stepped, instead of waiting for the whole step, and
with SGD (pieces of one wire chunk) each chunk is framed from values still in cache.

When a reply's fp32 chunk is exactly a piece whose step is due (`values_into`), the step writes the
new values straight into the reply message's data (ps.transport.message_buffer) and those values stay there:
the piece is "resident" in the message, which nothing writes to again, and the next step reads it
from there. The contiguous vector catches up only when something reads it whole (`flat`: an
evaluation, a snapshot, a checkpoint) or changes it otherwise. A BSP step then reads the parameters
and the gradient and writes the new values once, instead of writing them and copying them again
into the message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ps.job.spec import JobSpec
from ps.params.flat_state import flatten_state, state_numel, unflatten_state
from ps.params.stepping import make_stepper
from ps.transport.chunked import Vector, as_tensor, parts
from ps.transport.layout import flatten_params


class ParameterStore:
    """Global model state. BSP steps the optimizer with an aggregated gradient; ASP adds updates.

    `before_change` callbacks run before the values change (a step begins, an update, a load), so
    a reader that is still framing the current values (ps.transport.payload) can finish first.
    """

    def __init__(self, flat: torch.Tensor, spec: JobSpec, piece_values: int | None = None) -> None:
        """A store over a copy of `flat` (all parameters, or one shard's range of them), stepped in
        pieces of `piece_values` values (default: ps.params.stepping's for the optimizer)."""
        self._spec = spec
        self._flat = flat.detach().reshape(-1).float().clone()
        self._stepper = make_stepper(self._flat, spec, piece_values)
        self.pieces = self._stepper.pieces
        self._pending: Vector | None = None  # the gradient of a step begun and not yet fully applied
        self._next_piece = 0
        self._resident: dict[int, torch.Tensor] = {}  # piece -> its values, kept where a step wrote them (a sent message)
        self.before_change: list[Callable[[], None]] = []

    @classmethod
    def of_model(cls, model: nn.Module, spec: JobSpec) -> ParameterStore:
        return cls(flatten_params(model), spec)

    @property
    def flat(self) -> torch.Tensor:
        """All values, with any deferred step applied. Change them only through this class's methods."""
        self.settle()
        self._gather()
        return self._flat

    @property
    def numel(self) -> int:
        return self._flat.numel()

    @property
    def lr(self) -> float:
        return self._stepper.lr

    def set_lr(self, lr: float) -> None:
        self.settle()  # a deferred step keeps the learning rate it began with
        self._stepper.set_lr(lr)

    def values_into(self, start: int, stop: int, out: torch.Tensor) -> None:
        """Write values [start, stop), stepped as far as they need to be, into `out` (converted to its
        dtype). If [start, stop) is the next piece a deferred step owes and `out` is fp32, the step
        writes into `out` and the piece's values stay there: `out` must never be written again."""
        self.settle(start)
        index = self._next_piece
        if self._pending is not None and self.pieces[index] == (start, stop) and out.dtype == self._flat.dtype:
            self._step_next(out)
            self._resident[index] = out
            return
        self.settle(stop)
        self._gather(start, stop)
        out.copy_(self._flat[start:stop])

    def begin_step(self, grad: Vector) -> None:
        """θ ← optimizer_step(θ, g), applied piece by piece as values are read (`values_into`, `flat`,
        `settle`). The caller must leave `grad` unchanged until `settle()` has run. A ChunkedVector
        gradient is read where it lies: a piece inside one of its chunks steps from a view of it."""
        self._check_size(grad)
        self._changing()
        self._stepper.begin()
        self._pending, self._next_piece = grad, 0

    def settle(self, stop: int | None = None) -> None:
        """Apply the deferred step to every piece that holds a value before `stop` (default: all)."""
        stop = self.numel if stop is None else stop
        while self._pending is not None and self.pieces[self._next_piece][0] < stop:
            self._step_next()

    def _step_next(self, out: torch.Tensor | None = None) -> None:
        """Step the next piece the deferred step owes, from wherever its values are, into `out`
        (default: the contiguous vector)."""
        grad = self._pending
        assert grad is not None
        index = self._next_piece
        start, stop = self.pieces[index]
        param = self._resident.pop(index, None)
        if param is None:
            param = self._flat[start:stop]
        self._stepper.step_piece(index, grad[start:stop], param, self._flat[start:stop] if out is None else out)
        self._next_piece += 1
        if self._next_piece == len(self.pieces):
            self._pending = None
            self._stepper.end()

    def _gather(self, start: int = 0, stop: int | None = None) -> None:
        """Copy the resident pieces that hold values in [start, stop) back into the contiguous vector."""
        stop = self.numel if stop is None else stop
        for index in [i for i in self._resident if self.pieces[i][0] < stop and self.pieces[i][1] > start]:
            first, last = self.pieces[index]
            self._flat[first:last].copy_(self._resident.pop(index))

    def apply_gradient(self, grad: Vector) -> None:
        """θ ← optimizer_step(θ, g), at once."""
        self.begin_step(grad)
        self.settle()

    @torch.no_grad()
    def apply_update(self, delta: Vector) -> None:
        """θ ← θ + Δ (ASP: Δ is already scaled by the worker's learning rate)."""
        self._check_size(delta)
        self._changing()
        self._gather()
        for start, part in parts(delta):
            self._flat[start : start + part.numel()].add_(part)

    @torch.no_grad()
    def assign(self, values: Vector) -> None:
        """θ ← values (a snapshot from the collective fast path; a broadcast)."""
        self._check_size(values)
        self._changing()
        self._resident.clear()  # every value is replaced
        for start, part in parts(values):
            self._flat[start : start + part.numel()].copy_(part)

    def snapshot(self) -> torch.Tensor:
        return self.flat.clone()

    def optimizer_state(self) -> dict[str, Any]:
        """The optimizer's state as one optimizer over the whole vector would have it (a checkpoint
        resumes with any piece size or shard count)."""
        self.settle()
        return self._stepper.state_dict()

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        self._changing()
        self._stepper.load_state_dict(state)

    @property
    def optimizer_state_numel(self) -> int:
        """How many values `flat_optimizer_state` holds once the optimizer has stepped (0: it keeps none)."""
        return state_numel(self._spec, self.numel)

    def flat_optimizer_state(self) -> torch.Tensor | None:
        """The optimizer's state as one new fp32 vector (ps.params.flat_state); None before its first step."""
        return flatten_state(self.optimizer_state(), self._spec, self.numel)

    def load_flat_optimizer_state(self, values: Vector | None) -> None:
        """Replace the optimizer's state with `values` (None: as before its first step), keeping the
        hyperparameters. A vector of the wrong size is a ValueError and changes nothing."""
        groups = self.optimizer_state()["param_groups"]
        state = unflatten_state(None if values is None else as_tensor(values), groups, self._spec, self.numel)
        self.load_optimizer_state(state)

    def state_dict(self) -> dict:
        return {"params": self.snapshot(), "optimizer": self.optimizer_state()}

    def load_state_dict(self, state: dict) -> None:
        params = state["params"]
        if params.shape != self._flat.shape:
            raise ValueError(f"checkpoint has {params.numel()} parameters, the model has {self.numel}")
        self.assign(params)
        self.load_optimizer_state(state["optimizer"])

    def _check_size(self, values: Vector) -> None:
        if values.numel() != self.numel:
            raise ValueError(f"{values.numel()} values for {self.numel} parameters")

    def _changing(self) -> None:
        """Before the values change: finish a deferred step, then let readers of the current values finish."""
        self.settle()
        for callback in self.before_change:
            callback()

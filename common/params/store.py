"""The parameter store: one contiguous fp32 tensor of all parameters and a torch optimizer over it.

The optimizer steps the vector a piece at a time (common.params.stepping): SGD and Adam act value by value, so
the pieces stepped one after another equal the vector stepped whole. That lets a step be deferred
(`begin_step`) and applied only as far as a reader needs (`values_into`): a reply streams its first
chunks while the later pieces are still to be stepped, instead of waiting for the whole step, and
with SGD (pieces of one wire chunk) each chunk is framed from values still in cache.

When a reply's fp32 chunk is exactly a piece whose step is due (`values_into`), the step writes the
new values straight into the reply message's data (common.transport.message_buffer) and those values stay there:
the piece is "resident" in the message, which nothing writes to again, and the next step reads it
from there. The contiguous vector catches up only when something reads it whole (`flat`: an
evaluation, a snapshot, a checkpoint) or changes it otherwise. A BSP step then reads the parameters
and the gradient and writes the new values once, instead of writing them and copying them again
into the message. The deferred step and the resident pieces are deferred_step.py's; this module
holds the bounds that keep every value finite, the updates and the optimizer's state.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from common.job.spec import JobSpec
from common.params.flat_state import flatten_state, state_numel, unflatten_state
from common.params.deferred_step import DeferredStep
from common.params.stepping import StepBounds
from common.transport.chunked import Vector, as_tensor, parts
from common.transport.layout import flatten_params
from common.transport.magnitude import ROUNDING, OverflowRisk, exact_magnitude, magnitude_of, within_limit


class ParameterStore(DeferredStep):
    """Global model state. BSP steps the optimizer with an aggregated gradient; ASP adds updates.
    The step is deferred and applied as its values are read (deferred_step.py), and `before_change`
    callbacks run before the values change.

    No step or update can leave a value that is not finite: the store keeps a bound on its largest
    parameter (and the stepper on its state), works out before any change whether the incoming values
    could make a value exceed common.transport.magnitude.LIMIT, and refuses (OverflowRisk) before anything changes.
    The bounds grow from step to step; when one would refuse, the exact maxima are taken first.
    """

    def __init__(self, flat: torch.Tensor, spec: JobSpec, piece_values: int | None = None) -> None:
        """A store over a copy of `flat` (all parameters, or one shard's range of them), stepped in
        pieces of `piece_values` values (default: common.params.stepping's for the optimizer)."""
        super().__init__(flat, spec, piece_values)
        self._bound = self._finite_bound(self._flat)  # >= max|value| (common.transport.magnitude)
        self._exact = False  # whether the bounds are the exact maxima (nothing changed since they were taken)

    @classmethod
    def of_model(cls, model: nn.Module, spec: JobSpec) -> ParameterStore:
        return cls(flatten_params(model), spec)

    @property
    def lr(self) -> float:
        return self._stepper.lr

    def set_lr(self, lr: float) -> None:
        self.settle()  # a deferred step keeps the learning rate it began with
        self._stepper.set_lr(lr)

    def check_step(self, grad_bound: float, lr: float | None = None) -> None:
        """OverflowRisk unless a step with gradient values within `grad_bound` (at learning rate `lr`,
        default the current one) leaves every value finite. Changes no value."""
        self._plan_step(grad_bound, lr)

    def begin_step(self, grad: Vector, grad_bound: float | None = None) -> None:
        """θ ← optimizer_step(θ, g), applied piece by piece as values are read (`values_into`, `flat`,
        `settle`). The caller must leave `grad` unchanged until `settle()` has run. A ChunkedVector
        gradient is read where it lies: a piece inside one of its chunks steps from a view of it.
        `grad_bound` (>= max|g|; default measured here) decides whether the step is safe: if not, it
        raises OverflowRisk and changes nothing."""
        self._check_size(grad)
        bounds = self._plan_step(magnitude_of(grad) if grad_bound is None else grad_bound)
        self._changing()
        self._stepper.begin(bounds)
        self._bound, self._exact = bounds.params, False
        self._pending, self._next_piece = grad, 0

    def _plan_step(self, grad_bound: float, lr: float | None = None) -> StepBounds:
        bounds = self._stepper.step_bounds(grad_bound, self._bound, lr)
        if bounds is None and self._tighten():
            bounds = self._stepper.step_bounds(grad_bound, self._bound, lr)
        if bounds is None:
            raise OverflowRisk(f"a step with gradient values up to {grad_bound:.3g} on parameters up to "
                               f"{self._bound:.3g} could overflow fp32")
        return bounds

    def _tighten(self) -> bool:
        """Replace the bounds with the exact maxima; False if they already are."""
        if self._exact:
            return False
        self.settle()
        self._gather()
        self._bound = exact_magnitude(self._flat)
        self._stepper.rescan()
        self._exact = True
        return True

    def apply_gradient(self, grad: Vector, grad_bound: float | None = None) -> None:
        """θ ← optimizer_step(θ, g), at once (see `begin_step`)."""
        self.begin_step(grad, grad_bound)
        self.settle()

    def check_update(self, bound: float) -> float:
        """OverflowRisk unless θ + Δ with |Δ| within `bound` leaves every value finite; else the bound
        on the parameters after it. Changes no value."""
        after = self._bound + bound
        if not within_limit(after) and self._tighten():
            after = self._bound + bound
        if not within_limit(after):
            raise OverflowRisk(f"an update with values up to {bound:.3g} on parameters up to {self._bound:.3g} "
                               "could overflow fp32")
        return after

    @torch.no_grad()
    def apply_update(self, delta: Vector, bound: float | None = None, scale: float = 1.0) -> None:
        """θ ← θ + scale·Δ (ASP: Δ is already scaled by the worker's learning rate, `scale` <= 1 is
        --staleness-lr's factor). `bound` (>= max|scale·Δ|; default measured here) decides whether it
        is safe: if not, OverflowRisk and nothing changes."""
        self._check_size(delta)
        if not 0 < scale <= 1:
            raise ValueError(f"an update's scale must be in (0, 1], got {scale}")
        after = self.check_update(magnitude_of(delta) * scale if bound is None else bound)
        self._changing()
        self._gather()
        for start, part in parts(delta):
            self._flat[start : start + part.numel()].add_(part, alpha=scale)
        self._bound, self._exact = after * ROUNDING, False

    @torch.no_grad()
    def assign(self, values: Vector) -> None:
        """θ ← values (a snapshot from the collective fast path; a broadcast). ValueError, changing
        nothing, if a value is NaN or Inf."""
        self._check_size(values)
        bound = self._finite_bound(values)
        self._changing()
        self._resident.clear()  # every value is replaced
        for start, part in parts(values):
            self._flat[start : start + part.numel()].copy_(part)
        self._bound, self._exact = bound, False

    @staticmethod
    def _finite_bound(values: Vector) -> float:
        bound = magnitude_of(values)
        if not math.isfinite(bound):
            raise ValueError("the parameters hold NaN or Inf values")
        return bound

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
        self._exact = False

    @property
    def optimizer_state_numel(self) -> int:
        """How many values `flat_optimizer_state` holds once the optimizer has stepped (0: it keeps none)."""
        return state_numel(self._spec, self.numel)

    def flat_optimizer_state(self) -> torch.Tensor | None:
        """The optimizer's state as one new fp32 vector (common.params.flat_state); None before its first step."""
        return flatten_state(self.optimizer_state(), self._spec, self.numel)

    def load_flat_optimizer_state(self, values: Vector | None) -> None:
        """Replace the optimizer's state with `values` (None: as before its first step), keeping the
        hyperparameters. A vector of the wrong size is a ValueError and changes nothing."""
        groups = self.optimizer_state()["param_groups"]
        state = unflatten_state(None if values is None else as_tensor(values), groups, self._spec, self.numel)
        self.load_optimizer_state(state)

    def state_dict(self) -> dict[str, Any]:
        return {"params": self.snapshot(), "optimizer": self.optimizer_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        params = state["params"]
        if params.shape != self._flat.shape:
            raise ValueError(f"checkpoint has {params.numel()} parameters, the model has {self.numel}")
        self.assign(params)
        self.load_optimizer_state(state["optimizer"])

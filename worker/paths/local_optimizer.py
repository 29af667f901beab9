"""The job's optimizer on an ASP worker (OmniLearn's Algorithm 2): each worker steps its own copy of
--optimizer (momentum, Nesterov, weight decay, Adam) on the parameters it pulled, at the learning rate
the server tells it (η_k = η·b_k/B at the schedule's epoch), and pushes the update Δ = step(θ) − θ.

The state (momentum buffer, Adam's moments) is this worker's alone: it carries over batch-size and
learning-rate changes, and a rejoin starts it afresh (`reset`). The arithmetic is the server's own
(common.params.stepping: torch.optim's, a piece at a time), with its overflow bounds: a step that could
reach a non-finite value is refused here, before the state changes.
"""

from __future__ import annotations

from typing import Any

import torch

from common.job.spec import JobSpec
from common.params.stepping import Stepper, make_stepper
from common.transport.magnitude import magnitude


class StepRefused(ValueError):
    """The local step could overflow fp32 (or the gradient holds NaN/Inf); nothing changed."""


class LocalOptimizer:
    """One worker's optimizer over the flat parameter vector; `update` is Δ for one step."""

    def __init__(self, spec: JobSpec, params: torch.Tensor) -> None:
        self._spec = spec
        self._params = params
        self._delta = torch.empty_like(params)
        self._stepper: Stepper = make_stepper(params, spec)

    def reset(self) -> None:
        """Forget the state (a rejoin: this worker enters the job as a newcomer)."""
        self._stepper = make_stepper(self._params, self._spec)

    def state_dict(self) -> dict[str, Any]:
        """The state as torch.optim writes it for one parameter (tests read it)."""
        return self._stepper.state_dict()

    @torch.no_grad()
    def update(self, grads: torch.Tensor, lr: float) -> torch.Tensor:
        """Δ = step(θ, g) − θ at learning rate `lr`, with θ the parameters this worker holds; the state
        moves on one step. The returned tensor is reused by the next call. StepRefused if the step
        could overflow fp32, the state then unchanged."""
        stepper = self._stepper
        stepper.set_lr(lr)
        bounds = stepper.step_bounds(magnitude(grads), magnitude(self._params))
        if bounds is None:
            raise StepRefused(f"a local {self._spec.optimizer} step with these gradients could overflow fp32")
        stepper.begin(bounds)
        for index, (start, stop) in enumerate(stepper.pieces):
            stepper.step_piece(index, grads[start:stop], self._params[start:stop], self._delta[start:stop])
        stepper.end()
        return self._delta.sub_(self._params)

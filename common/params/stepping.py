"""How the parameter store steps its optimizer a piece (a range of the flat vector) at a time.

SGD (momentum, dampening, Nesterov, weight decay, maximize) and Adam (weight decay, maximize) are
written out as torch's single-tensor implementations compute them, on views of the vector and of
state buffers the stepper keeps itself (`SGDSteps`, `AdamSteps`, one interface: `Stepper`). A piece
costs a few torch calls (~10-20 us), so pieces can be as small as one wire chunk: the framing of a
reply then reads each piece's new values while they are still in cache.

Both act value by value, so stepping the pieces one after another equals stepping the whole vector,
and equals torch.optim's own step (bit for bit: piece sizes are multiples of every SIMD width, so
only the last piece has a scalar tail, the one the whole vector would have; tests/common/params/test_store.py
checks both against torch.optim). They read and write torch.optim's state dict for one parameter
over the whole vector, so checkpoints load in either. No torch optimizer is built: the first one a
process builds imports torch._dynamo (~1.5 s of CPU, ~12 s for a fast-path worker on a 1/8-core quota).

Each stepper also bounds its arithmetic (`step_bounds`): from bounds on the gradient, the parameters
and its state buffers it works out, in a few float operations, bounds on every value one step computes,
so the store can refuse a step that could overflow fp32 before it changes anything (common.transport.magnitude).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch

from common.job.spec import JobSpec
from common.params.hyperparameters import check_adam, check_sgd
from common.transport.magnitude import ROUNDING, exact_magnitude, magnitude, within_limit
from common.transport.wire import CHUNK_BYTES, spans

# one fp32 wire chunk (1 MiB), so a reply's chunk is framed from a piece just stepped
PIECE_VALUES = CHUNK_BYTES // 4

Range = tuple[int, int]


@dataclass(frozen=True)
class StepBounds:
    """Upper bounds on max|value| after a step: the parameters, and each optimizer state buffer."""

    params: float
    state: dict[str, float] = field(default_factory=dict)


class Stepper(Protocol):
    """Steps the optimizer over `flat` one piece at a time: `begin`, `step_piece` for every piece in
    order, `end`. Between `begin` and `end` nothing else may touch the optimizer."""

    pieces: list[Range]

    @property
    def lr(self) -> float: ...

    def set_lr(self, lr: float) -> None: ...

    def step_bounds(self, grad: float, params: float, lr: float | None = None) -> StepBounds | None:
        """Bounds after one step with a gradient whose values are within `grad` on parameters within
        `params` (at learning rate `lr`, default the group's), or None if some value the step computes
        could exceed common.transport.magnitude.LIMIT. Changes nothing."""

    def begin(self, bounds: StepBounds) -> None:
        """Start a step that `step_bounds` allowed, keeping its state bounds."""

    def step_piece(self, index: int, grad: torch.Tensor, param: torch.Tensor, out: torch.Tensor) -> None:
        """Step piece `index`: its values are read from `param` and the new ones written to `out`
        (the same tensor to step in place; common.params.store may pass a reply message's data instead)."""

    def end(self) -> None: ...

    def rescan(self) -> None:
        """Replace the state bounds by the state's exact maxima (bounds only grow from step to step)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def make_stepper(flat: torch.Tensor, spec: JobSpec, piece_values: int | None = None) -> Stepper:
    """The stepper for the job's optimizer over `flat` (stepped in place)."""
    return STEPPERS[spec.optimizer](flat, spec, PIECE_VALUES if piece_values is None else piece_values)


class _OneParameterState:
    """What the written-out optimizers share: the pieces, torch's parameter group (its keys, in its
    order) and the per-value state buffers, read and written as torch.optim's state dict of one
    parameter (index 0). Before the first step there is no state, as in torch."""

    NAME: ClassVar[str]
    BUFFERS: ClassVar[tuple[str, ...]]  # the per-value state, in torch's order
    SCALARS: ClassVar[tuple[str, ...]] = ()  # the state's single numbers (`_scalars`), in torch's order

    def __init__(self, flat: torch.Tensor, group: dict[str, Any], piece_values: int) -> None:
        self._flat = flat
        self.pieces = spans(flat.numel(), piece_values)
        self._group = group
        self._buffers: dict[str, torch.Tensor] = {}  # empty until the first step (when the optimizer keeps any)
        self._bounds: dict[str, float] = {}  # >= max|value| of each buffer (common.transport.magnitude)

    @property
    def lr(self) -> float:
        return float(self._group["lr"])

    def set_lr(self, lr: float) -> None:
        self._group["lr"] = lr

    def _scalars(self) -> dict[str, Any]:
        """The state's entries besides the buffers (Adam's step count), as torch writes them."""
        return {}

    def _load_scalars(self, per_param: dict[str, Any]) -> None:
        """Take the entries `_scalars` writes (validated by `_check_scalars`)."""

    def _check_scalars(self, per_param: dict[str, Any]) -> None:
        """ValueError unless `per_param` holds valid entries besides the buffers."""

    def _check_group(self, group: dict[str, Any]) -> None:
        """ValueError for hyperparameters this arithmetic does not implement or the optimizer does not
        accept (common.params.hyperparameters)."""

    def _bound(self, key: str) -> float:
        return self._bounds.get(key, 0.0)

    def rescan(self) -> None:
        self._bounds = {key: exact_magnitude(buffer) for key, buffer in self._buffers.items()}

    def state_dict(self) -> dict[str, Any]:
        state = {0: {**self._scalars(), **{k: v.clone() for k, v in self._buffers.items()}}} if self._buffers else {}
        return {"state": state, "param_groups": [dict(self._group)]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take a torch.optim state dict over one parameter of this vector's size (as torch does, the
        saved hyperparameters replace the job's); a malformed one is a ValueError and changes nothing."""
        groups = state.get("param_groups") if isinstance(state, dict) else None
        per_params = state.get("state") if isinstance(state, dict) else None
        if not (isinstance(groups, list) and len(groups) == 1 and isinstance(groups[0], dict) and isinstance(per_params, dict)):
            raise ValueError(f"an {self.NAME} state dict has one parameter group and a per-parameter state")
        if set(per_params) - {0} or not isinstance(per_params.get(0, {}), dict):
            raise ValueError(f"an {self.NAME} state dict of one parameter has state for {sorted(map(str, per_params))}")
        per_param = per_params.get(0, {})
        present = [key for key in self.BUFFERS if per_param.get(key) is not None]
        if present and len(present) != len(self.BUFFERS):
            raise ValueError(f"an {self.NAME} state has all of {', '.join(self.BUFFERS)} or none, got {', '.join(present)}")
        buffers = {key: self._checked_buffer(key, per_param[key]) for key in present}
        bounds = {key: magnitude(buffer) for key, buffer in buffers.items()}
        if not all(map(math.isfinite, bounds.values())):
            raise ValueError(f"the {self.NAME} state holds NaN or Inf values")
        if buffers:
            self._check_scalars(per_param)
        group = {**self._group, **{k: v for k, v in groups[0].items() if k != "params"}, "params": [0]}
        self._check_group(group)
        self._group, self._buffers, self._bounds = group, buffers, bounds
        if buffers:
            self._load_scalars(per_param)

    def _checked_buffer(self, key: str, value: Any) -> torch.Tensor:
        numel = self._flat.numel()
        if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.numel() != numel:
            raise ValueError(f"the {key} must be a float tensor of {numel} values")
        return value.detach().reshape(-1).to(self._flat.dtype, copy=True)

    def _step_inputs(self, grad: float, params: float, lr: float | None) -> tuple[float, float, float]:
        """(bound of the gradient after weight decay, |weight decay| * params, |lr|): every step's start."""
        decay = abs(self._group["weight_decay"]) * params
        return grad + decay, decay, abs(self._group["lr"] if lr is None else lr)


class SGDSteps(_OneParameterState):
    """torch.optim.SGD's arithmetic on ranges of the whole vector. The first step with momentum
    starts the buffer as a copy of the gradient, as torch does."""

    NAME = "SGD"
    BUFFERS = ("momentum_buffer",)

    def __init__(self, flat: torch.Tensor, spec: JobSpec, piece_values: int) -> None:
        super().__init__(flat, sgd_group(spec), piece_values)
        self._fresh = False  # this step starts the buffer (copies the gradient into it)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_sgd(group)

    def step_bounds(self, grad: float, params: float, lr: float | None = None) -> StepBounds | None:
        """g' = g + wd·θ; buf = m·buf + (1 - dampening)·g' (the first step: g'); the update is buf, or
        g' + m·buf with Nesterov (g' without momentum); θ - lr·update."""
        group = self._group
        g, decay, rate = self._step_inputs(grad, params, lr)
        momentum = abs(group["momentum"])
        state: dict[str, float] = {}
        values = [g, decay]
        update = g
        if momentum != 0:
            old = self._bound("momentum_buffer")
            buf = g if not self._buffers else momentum * old + abs(1 - group["dampening"]) * g
            update = g + momentum * buf if group["nesterov"] else buf
            state["momentum_buffer"] = buf * ROUNDING
            values += [momentum * old, buf, update]
        after = params + rate * update
        if not within_limit(*values, rate * update, after):
            return None
        return StepBounds(after * ROUNDING, state)

    def begin(self, bounds: StepBounds) -> None:
        self._fresh = self._group["momentum"] != 0 and not self._buffers
        if self._fresh:
            self._buffers = {"momentum_buffer": torch.empty_like(self._flat)}
        self._bounds = dict(bounds.state)

    @torch.no_grad()
    def step_piece(self, index: int, grad: torch.Tensor, param: torch.Tensor, out: torch.Tensor) -> None:
        start, stop = self.pieces[index]
        group = self._group
        if group["maximize"]:
            grad = -grad
        if group["weight_decay"] != 0:
            grad = grad.add(param, alpha=group["weight_decay"])
        momentum = group["momentum"]
        if momentum != 0:
            buf = self._buffers["momentum_buffer"][start:stop]
            if self._fresh:
                buf.copy_(grad)
            else:
                buf.mul_(momentum).add_(grad, alpha=1 - group["dampening"])
            grad = grad.add(buf, alpha=momentum) if group["nesterov"] else buf
        torch.add(param, grad, alpha=-group["lr"], out=out)

    def end(self) -> None:
        self._fresh = False


def sgd_group(spec: JobSpec) -> dict[str, Any]:
    """The parameter group torch.optim.SGD builds for the job's hyperparameters (key order included)."""
    return {"lr": spec.lr, "momentum": spec.momentum, "dampening": 0, "weight_decay": spec.weight_decay,
            "nesterov": spec.nesterov, "maximize": False, "foreach": None, "differentiable": False,
            "fused": None, "params": [0]}


class AdamSteps(_OneParameterState):
    """torch.optim.Adam's single-tensor arithmetic (no amsgrad, weight decay coupled as in Adam, not
    AdamW) on ranges of the whole vector. The step count is one for the whole vector: torch keeps one
    per parameter, and here the vector is the one parameter."""

    NAME = "Adam"
    BUFFERS = ("exp_avg", "exp_avg_sq")
    SCALARS = ("step",)

    def __init__(self, flat: torch.Tensor, spec: JobSpec, piece_values: int) -> None:
        super().__init__(flat, adam_group(spec), piece_values)
        self._step = 0.0

    def _scalars(self) -> dict[str, Any]:
        return {"step": torch.tensor(self._step)}

    def _check_scalars(self, per_param: dict[str, Any]) -> None:
        step = per_param.get("step")
        if isinstance(step, (int, float)) or (isinstance(step, torch.Tensor) and step.numel() == 1):
            value = float(step)
        else:
            value = -1.0
        if not (value >= 1 and value.is_integer()):
            raise ValueError(f"an Adam state's step count must be a whole number >= 1, got {step!r}")

    def _load_scalars(self, per_param: dict[str, Any]) -> None:
        self._step = float(per_param["step"])

    def _check_group(self, group: dict[str, Any]) -> None:
        check_adam(group)

    def step_bounds(self, grad: float, params: float, lr: float | None = None) -> StepBounds | None:
        """g' = g + wd·θ; m = lerp(m, g', 1 - β1) stays within max(|m|, |g'|) (its difference within
        their sum); v = β2·v + (1 - β2)·g'² (g'² formed first); the update m/(√v/√bc2 + eps) is at most
        |m|/eps, times lr/bc1. Loose where v is small, and far from any value training reaches."""
        group = self._group
        g, decay, rate = self._step_inputs(grad, params, lr)
        beta1, beta2 = group["betas"]
        eps = group["eps"]
        step = self._step + 1
        correction1, correction2 = 1 - beta1**step, 1 - beta2**step
        if not (eps > 0 and correction1 > 0 and correction2 > 0):
            return None
        old_avg, old_sq = self._bound("exp_avg"), self._bound("exp_avg_sq")
        avg = max(old_avg, g)
        square = g * g
        sq = abs(beta2) * old_sq + abs(1 - beta2) * square
        update = rate / correction1 * avg / eps
        after = params + update
        if not within_limit(g, decay, old_avg + g, square, sq, math.sqrt(sq / correction2) + eps, update, after):
            return None
        return StepBounds(after * ROUNDING, {"exp_avg": avg * ROUNDING, "exp_avg_sq": sq * ROUNDING})

    def begin(self, bounds: StepBounds) -> None:
        if not self._buffers:
            self._buffers = {key: torch.zeros_like(self._flat) for key in self.BUFFERS}
        self._step += 1
        self._bounds = dict(bounds.state)

    @torch.no_grad()
    def step_piece(self, index: int, grad: torch.Tensor, param: torch.Tensor, out: torch.Tensor) -> None:
        start, stop = self.pieces[index]
        group = self._group
        if grad.dtype != param.dtype:  # a bf16/fp16 push's chunk: Adam reads it four times
            grad = grad.to(param.dtype)
        if group["maximize"]:
            grad = -grad
        if group["weight_decay"] != 0:
            grad = grad.add(param, alpha=group["weight_decay"])
        beta1, beta2 = group["betas"]
        exp_avg = self._buffers["exp_avg"][start:stop]
        exp_avg_sq = self._buffers["exp_avg_sq"][start:stop]
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        bias_correction1 = 1 - beta1**self._step
        bias_correction2 = 1 - beta2**self._step
        step_size = group["lr"] / bias_correction1
        denom = (exp_avg_sq.sqrt() / bias_correction2**0.5).add_(group["eps"])
        torch.addcdiv(param, exp_avg, denom, value=-step_size, out=out)

    def end(self) -> None:
        pass


def adam_group(spec: JobSpec) -> dict[str, Any]:
    """The parameter group torch.optim.Adam builds for the job's hyperparameters (key order included)."""
    return {"lr": spec.lr, "betas": (0.9, 0.999), "eps": 1e-08, "weight_decay": spec.weight_decay, "amsgrad": False,
            "maximize": False, "foreach": None, "capturable": False, "differentiable": False, "fused": None,
            "decoupled_weight_decay": False, "params": [0]}


# the stepper of each --optimizer (common.params.flat_state reads their state's layout from these classes)
STEPPERS: dict[str, type[SGDSteps] | type[AdamSteps]] = {"sgd": SGDSteps, "adam": AdamSteps}

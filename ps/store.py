"""The parameter store: one contiguous fp32 tensor of all parameters and a torch optimizer over it."""

from __future__ import annotations

import torch
from torch import nn

from ps.jobspec import JobSpec
from ps.wire import flatten_params


def make_optimizer(params: list[nn.Parameter], spec: JobSpec) -> torch.optim.Optimizer:
    if spec.optimizer == "adam":
        return torch.optim.Adam(params, lr=spec.lr, weight_decay=spec.weight_decay)
    return torch.optim.SGD(
        params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay, nesterov=spec.nesterov
    )


class ParameterStore:
    """Global model state. BSP steps the optimizer with an aggregated gradient; ASP adds updates."""

    def __init__(self, flat: torch.Tensor, spec: JobSpec) -> None:
        """A store over a copy of `flat` (all parameters, or one shard's range of them)."""
        self.param = nn.Parameter(flat.detach().reshape(-1).float().clone())
        self.optimizer = make_optimizer([self.param], spec)

    @classmethod
    def of_model(cls, model: nn.Module, spec: JobSpec) -> ParameterStore:
        return cls(flatten_params(model), spec)

    @property
    def flat(self) -> torch.Tensor:
        return self.param.data

    @property
    def numel(self) -> int:
        return self.param.numel()

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def apply_gradient(self, grad: torch.Tensor) -> None:
        """θ ← optimizer_step(θ, g)."""
        self.param.grad = grad
        self.optimizer.step()
        self.param.grad = None

    @torch.no_grad()
    def apply_update(self, delta: torch.Tensor) -> None:
        """θ ← θ + Δ (ASP: Δ is already scaled by the worker's learning rate)."""
        self.param.add_(delta)

    def snapshot(self) -> torch.Tensor:
        return self.param.detach().clone()

    def state_dict(self) -> dict:
        return {"params": self.snapshot(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        params = state["params"]
        if params.shape != self.param.shape:
            raise ValueError(f"checkpoint has {params.numel()} parameters, the model has {self.numel}")
        with torch.no_grad():
            self.param.copy_(params)
        self.optimizer.load_state_dict(state["optimizer"])

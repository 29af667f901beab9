"""torch.optim as the reference the flat stores are checked against."""

from __future__ import annotations

import torch

from common.job.spec import JobSpec


def torch_optimizer(param: torch.nn.Parameter, spec: JobSpec) -> torch.optim.Optimizer:
    """torch.optim's optimizer for the job's hyperparameters: the reference common.params.stepping is checked against."""
    if spec.optimizer == "adam":
        return torch.optim.Adam([param], lr=spec.lr, weight_decay=spec.weight_decay)
    return torch.optim.SGD([param], lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay,
                           nesterov=spec.nesterov)

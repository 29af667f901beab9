"""The optimizer's state as one fp32 vector, so the collective fast path can move it as it moves
parameters (a snapshot to the server, a pull from it after a resume).

Pure: no I/O. The vector's layout is fixed by the job's optimizer, for a model of `numel` values:
- SGD with momentum: the momentum buffer (`numel` values); SGD without momentum keeps no state;
- Adam: the step count, then `exp_avg`, then `exp_avg_sq` (1 + 2·`numel` values). torch keeps the
  step as an fp32 tensor too, so the vector holds it exactly.
An optimizer that has not stepped yet has no state: None here, no values on the wire.
The state dicts are torch.optim's for one parameter over the whole vector (common.params.stepping's format).
"""

from __future__ import annotations

from typing import Any

import torch

from common.job.spec import JobSpec
from common.params.stepping import STEPPERS


def _keys(spec: JobSpec) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The stepper's single numbers and per-value buffers, in the vector's order (none for SGD
    without momentum, which keeps no state)."""
    if spec.optimizer == "sgd" and spec.momentum == 0:
        return (), ()
    stepper = STEPPERS[spec.optimizer]
    return stepper.SCALARS, stepper.BUFFERS


def state_numel(spec: JobSpec, numel: int) -> int:
    """How many values the flat state of a `numel`-value model holds (0: the optimizer keeps none)."""
    scalars, buffers = _keys(spec)
    return len(scalars) + len(buffers) * numel


def flatten_state(state: dict[str, Any], spec: JobSpec, numel: int) -> torch.Tensor | None:
    """The state dict's per-parameter state as one new fp32 vector; None when it has none."""
    per_param = state["state"].get(0)
    scalars, buffers = _keys(spec)
    if not per_param or not buffers:
        return None
    pieces = [torch.tensor([float(per_param[key]) for key in scalars])]
    pieces += [per_param[key].detach().reshape(-1).float() for key in buffers]
    flat = torch.cat(pieces)
    if flat.numel() != state_numel(spec, numel):
        raise ValueError(f"the optimizer state has {flat.numel()} values, a model of {numel} needs {state_numel(spec, numel)}")
    return flat


def unflatten_state(
    values: torch.Tensor | None, param_groups: list[dict[str, Any]], spec: JobSpec, numel: int
) -> dict[str, Any]:
    """A state dict with `param_groups` and the state `values` hold (None: no state yet). A vector
    of the wrong size is a ValueError."""
    if values is None:
        return {"state": {}, "param_groups": param_groups}
    expected = state_numel(spec, numel)
    if values.numel() != expected:
        raise ValueError(f"an optimizer state of {values.numel()} values; this job's {spec.optimizer} keeps "
                         f"{expected} for {numel} parameters")
    values = values.reshape(-1).float()
    scalars, buffers = _keys(spec)
    per_param: dict[str, Any] = {key: values[i].clone() for i, key in enumerate(scalars)}  # the stepper checks them
    offset = len(scalars)
    for key in buffers:
        per_param[key] = values[offset : offset + numel].clone()
        offset += numel
    return {"state": {0: per_param}, "param_groups": param_groups}

"""The hyperparameters each optimizer of the store accepts in a parameter group: what a state dict
from a checkpoint or a Load may set, checked before it replaces the job's.

A group read back is data from a disk or a peer: `momentum=NaN` would poison every step, `maximize=True`
would climb the loss, `dampening=-5` would grow the momentum buffer without bound. Each check is a
ValueError that names the hyperparameter, the range it must lie in and the value it got. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common.number_checks import real_number


def _number(group: Mapping[str, Any], key: str, low: float, high: float, *, open_low: bool = False,
            open_high: bool = False) -> float:
    """The group's `key` as a finite number in the range; ValueError naming it otherwise."""
    value = group.get(key)
    number = real_number(value)
    left, right = "(" if open_low else "[", ")" if open_high else "]"
    inside = number is not None and (number > low if open_low else number >= low) and (
        number < high if open_high else number <= high)
    if not inside:
        raise ValueError(f"the optimizer's {key} must be a number in {left}{low:g}, {high:g}{right}, got {value!r}")
    return number  # type: ignore[return-value]


def _flag(group: Mapping[str, Any], key: str, allowed: tuple[bool, ...] = (False, True)) -> bool:
    value = group.get(key)
    if not isinstance(value, bool) or value not in allowed:
        choices = " or ".join(str(a) for a in allowed)
        raise ValueError(f"the optimizer's {key} must be {choices}, got {value!r}")
    return value


def check_common(group: Mapping[str, Any]) -> None:
    """What every optimizer here reads: a finite lr > 0, a finite weight decay >= 0, and `maximize`
    off (every job minimises its loss)."""
    _number(group, "lr", 0.0, float("inf"), open_low=True, open_high=True)
    _number(group, "weight_decay", 0.0, float("inf"), open_high=True)
    _flag(group, "maximize", (False,))


def check_sgd(group: Mapping[str, Any]) -> None:
    """SGD: momentum in [0, 1), dampening in [0, 1], Nesterov only with momentum and no dampening (torch's rule)."""
    check_common(group)
    momentum = _number(group, "momentum", 0.0, 1.0, open_high=True)
    dampening = _number(group, "dampening", 0.0, 1.0)
    if _flag(group, "nesterov") and (momentum == 0 or dampening != 0):
        raise ValueError(f"the optimizer's nesterov needs momentum > 0 and dampening 0, got momentum {momentum!r} "
                         f"and dampening {dampening!r}")


def check_adam(group: Mapping[str, Any]) -> None:
    """Adam: both betas in [0, 1), a finite eps > 0; plain Adam only (no amsgrad, no decoupled weight decay)."""
    check_common(group)
    betas = group.get("betas")
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"the optimizer's betas must be two numbers in [0, 1), got {betas!r}")
    for i, beta in enumerate(betas):
        _number({f"betas[{i}]": beta}, f"betas[{i}]", 0.0, 1.0, open_high=True)
    _number(group, "eps", 0.0, float("inf"), open_low=True, open_high=True)
    if group.get("amsgrad") or group.get("decoupled_weight_decay"):
        raise ValueError("the Adam store steps plain Adam: amsgrad and decoupled weight decay are not supported")

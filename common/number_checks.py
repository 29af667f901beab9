"""Checks for numbers users give as data: a model or dataset factory's options (`--model-arg`,
`--dataset-arg`), a profile file's numbers, an estimator's saved state.

The options arrive as JSON-parsed command-line values, so a factory gets whatever a user typed: a
negative width, a string, `NaN`. These checks turn such a value into a ValueError that names the
option, before torch fails somewhere deeper with a traceback that does not, or builds a model with
no parameters that trains nothing. A leaf: it imports nothing of the project, so every folder of ps
may use it (ps/control/ too).
"""

from __future__ import annotations

import math
from typing import Any


def real_number(value: Any) -> float | None:
    """`value` as a finite float, or None if it is not one: a bool, a string, NaN, infinity, or an
    integer too large for a float. Also what deploy.profiles reads a profile file's numbers with."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def whole(name: str, value: Any, minimum: int) -> int:
    """`value` as an int >= `minimum`; a bool, a fraction or a non-number is a ValueError."""
    number = real_number(value)
    if number is None or not number.is_integer():
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    if number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)


def finite(name: str, value: Any, low: float, high: float = math.inf, *, open_low: bool = False,
           open_high: bool = False) -> float:
    """`value` as a finite float in [low, high] (either end open when asked); else a ValueError."""
    number = real_number(value)
    if number is None:
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    below = number <= low if open_low else number < low
    above = number >= high if open_high else number > high
    if below or above:
        left, right = "(" if open_low else "[", ")" if open_high else "]"
        raise ValueError(f"{name} must be in {left}{low:g}, {high:g}{right}, got {value!r}")
    return number

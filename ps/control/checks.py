"""Number checks the batch policies share: a value as an int, a finite real, a positive real, or
per-worker mappings with the same keys; each failure is a ValueError that names the value."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any


def integer(name: str, value: Any, minimum: int | None = None) -> int:
    """Return `value` as an int, or raise ValueError naming `name` (bools are not integers here)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    result = int(value)
    if minimum is not None and result < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {result}")
    return result


def real(name: str, value: Any) -> float:
    """Return `value` as a finite float, or raise ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    result = float(value)
    if not math.isfinite(result):
        raise ValueError(f"{name} must be finite, got {result}")
    return result


def positive(name: str, value: Any) -> float:
    """Return `value` as a finite float > 0, or raise ValueError naming `name`."""
    result = real(name, value)
    if result <= 0:
        raise ValueError(f"{name} must be > 0, got {result}")
    return result


def integers(what: str, values: Mapping[str, Any], keys: Iterable[str]) -> dict[str, int]:
    """`integer` of each of `keys`' values, named "<what> of <key>": the name is written only for a
    value that is not an int already (a plan's thousands of batches are checked at every decision)."""
    return {k: v if type(v := values[k]) is int else integer(f"{what} of {k!r}", v) for k in keys}


def positives(what: str, values: Mapping[str, Any]) -> dict[str, float]:
    """`positive` of each value, named "<what> of <key>", written only for one that is not a finite
    float above 0 already."""
    return {k: v if type(v) is float and 0.0 < v < math.inf else positive(f"{what} of {k!r}", v)
            for k, v in values.items()}


def reals(what: str, values: Mapping[str, Any]) -> dict[str, float]:
    """`real` of each value, named "<what> of <key>", written only for one that is not a finite float already."""
    return {k: v if type(v) is float and -math.inf < v < math.inf else real(f"{what} of {k!r}", v)
            for k, v in values.items()}


def same_keys(**maps: Mapping[str, Any]) -> None:
    """Raise ValueError unless all mappings have the same keys (the per-worker inputs must line up)."""
    names = list(maps)
    first = set(maps[names[0]])
    for name in names[1:]:
        if set(maps[name]) != first:
            raise ValueError(f"{names[0]} and {name} must have the same worker ids")

"""The declared range of a built-in model's or data set's numeric options, checked before its factory runs.

A server may hand a worker any option value in the job spec, and an operator may type any: a value far
out of range (`layers=3000000`) would build for minutes, or ask for more memory than the machine has,
before anything failed. Each built-in declares the range of every number it takes
(common.job.models.MODEL_RANGES, common.job.datasets.DATASET_RANGES); a value outside it, or not a
number of the declared kind, is a ValueError naming the factory, the option, its range and the value.
Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from common.number_checks import finite, whole


@dataclass(frozen=True)
class Bound:
    """An option's range: whole numbers in [low, high], or (`real`) finite numbers, either end open when asked."""

    low: float
    high: float = math.inf
    real: bool = False
    open_low: bool = False
    open_high: bool = False

    def describe(self) -> str:
        left, right = "(" if self.open_low else "[", ")" if self.open_high else "]"
        return f"{left}{self._show(self.low)}, {self._show(self.high)}{right}"

    def _show(self, end: float) -> str:
        return str(int(end)) if not self.real and math.isfinite(end) else f"{end:g}"

    def check(self, option: str, value: Any) -> None:
        """ValueError naming `option`, this range and `value` unless the value lies in it."""
        try:
            if self.real:
                finite(option, value, self.low, self.high, open_low=self.open_low, open_high=self.open_high)
                return
            number = whole(option, value, int(self.low))
        except ValueError as exc:
            said = str(exc)
            raise ValueError(said if self.describe() in said else f"{said} (its range: {self.describe()})") from None
        if number > self.high:
            raise ValueError(f"{option} must be in {self.describe()}, got {value!r}")


FRACTION = Bound(0.0, 1.0, real=True, open_low=True, open_high=True)
"""A share strictly between 0 and 1 (a test split)."""
PROBABILITY = Bound(0.0, 1.0, real=True)
SCALE = Bound(0.0, real=True)
"""A non-negative factor of values already drawn (noise, separation): it changes no size."""


def check_ranges(kind: str, name: str, options: Mapping[str, Any], ranges: Mapping[str, Bound]) -> None:
    """ValueError, naming the factory and the option, for the first option of `options` outside its
    declared range in `ranges` (options without one are the factory's to check)."""
    for option, value in options.items():
        bound = ranges.get(option)
        if bound is None:
            continue
        try:
            bound.check(option, value)
        except ValueError as exc:
            raise ValueError(f"{kind} {name!r} rejected its options {dict(options)}: {exc}") from None

"""Exponential backoff with full jitter, bounded per wait and in total (for reconnects)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Waits of random length in [0, min(maximum, initial * 2^k)], until `total` seconds are used up."""

    initial: float = 0.2
    maximum: float = 5.0
    total: float = 120.0
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        if not (0 < self.initial <= self.maximum) or self.total < 0:
            raise ValueError("backoff needs 0 < initial <= maximum and total >= 0")

    def delays(self) -> Iterator[float]:
        spent, attempt = 0.0, 0
        while spent < self.total:
            cap = min(self.maximum, self.initial * 2**attempt)
            delay = min(self.rng.uniform(0.0, cap), self.total - spent)
            spent += delay
            attempt += 1
            yield delay

"""Simulated workers: each one's step time as a line in its batch, t = q·b + s, times a
multiplicative lognormal noise, drawn for a whole population at once (numpy, so that ten thousand
workers cost one vector operation a round).

Two laws of speed: lognormal speeds (the time per sample q = q_median · e^(σ·z), every worker with
the same fixed cost s per step) or a mix of device classes (each class its own q and s, each worker
one class drawn by the classes' weights). A speed change multiplies a worker's q and s alike, as a
CPU share does."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

MAX_SIGMA = 3.0
"""The largest lognormal σ a law takes, for the workers' speeds and for a step's noise: three
standard deviations out is e^9 ≈ 8,000 times the median already, and a σ of hundreds sends step
times past what a float holds."""
MIN_Q_MS, MAX_MS = 1e-12, 1e12
"""The range of a time per sample a law takes, and the largest fixed cost (ms; 1e12 ms is some 30
years). With σ and noise at most MAX_SIGMA, a speed change at most engine.py's MAX_FACTOR and B at
most its MAX_GLOBAL_BATCH, every step and round stays a finite float, as the policies require of a
time (ps/control/checks.py `real`), and so does a round over the optimum's in the report: q = 1e306
ms, or classes a thousand orders of magnitude apart, give steps and ratios that overflow to inf."""


def _finite(*values: float) -> bool:
    return all(math.isfinite(v) for v in values)


def _law_ok(q_ms: float, s_ms: float) -> bool:
    """Whether a time per sample and a fixed cost are within [MIN_Q_MS, MAX_MS] and [0, MAX_MS]."""
    return MIN_Q_MS <= q_ms <= MAX_MS and 0 <= s_ms <= MAX_MS


LAW_RANGE = f"q_ms in [{MIN_Q_MS:g}, {MAX_MS:g}], s_ms in [0, {MAX_MS:g}]"


@dataclass(frozen=True)
class DeviceClass:
    """One kind of worker: its time per sample and fixed cost per step (ms), and its weight in the mix."""

    name: str
    q_ms: float
    s_ms: float
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not (_law_ok(self.q_ms, self.s_ms) and _finite(self.weight) and self.weight > 0):
            raise ValueError(f"device class {self.name!r} needs {LAW_RANGE} and a finite weight > 0; "
                             f"got q_ms {self.q_ms:g}, s_ms {self.s_ms:g}, weight {self.weight:g}")


@dataclass(frozen=True)
class SpeedLaw:
    """How a population's workers are drawn: lognormal speeds around `q_ms` with spread `sigma` and a
    common fixed cost `s_ms`, or (when `classes` is given) a mix of device classes; `noise` is the
    σ of each step's multiplicative lognormal noise."""

    q_ms: float = 0.5
    s_ms: float = 10.0
    sigma: float = 0.5
    noise: float = 0.05
    classes: Sequence[DeviceClass] = ()
    given: Sequence[tuple[float, float]] = ()
    """Each worker's (q, s) in the order they are drawn, instead of drawing them (a replay of laws
    measured in a real run); the draws past the list's end cycle through it."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "classes", tuple(self.classes))
        object.__setattr__(self, "given", tuple((float(q), float(s)) for q, s in self.given))
        if any(not (_finite(q, s) and q > 0 and s >= 0) for q, s in self.given):
            raise ValueError(f"given laws need finite q > 0 and s >= 0; got {self.given}")
        if not (_law_ok(self.q_ms, self.s_ms) and 0 <= self.sigma <= MAX_SIGMA and 0 <= self.noise <= MAX_SIGMA):
            raise ValueError(f"a speed law needs {LAW_RANGE}, sigma and noise in [0, {MAX_SIGMA:g}]; "
                             f"got q_ms {self.q_ms:g}, s_ms {self.s_ms:g}, sigma {self.sigma:g}, noise {self.noise:g}")

    def draw(self, count: int, rng: np.random.Generator, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """`count` workers' (q, s), in ms per sample and ms per step (`start`: how many were drawn before)."""
        if self.given:
            laws = [self.given[(start + i) % len(self.given)] for i in range(count)]
            return np.array([q for q, _ in laws], dtype=float), np.array([s for _, s in laws], dtype=float)
        if self.classes:
            weights = np.array([c.weight for c in self.classes], dtype=float)
            weights /= weights.max()  # weights near the largest float would sum to inf
            picked = rng.choice(len(self.classes), size=count, p=weights / weights.sum())
            q = np.array([c.q_ms for c in self.classes])[picked]
            s = np.array([c.s_ms for c in self.classes])[picked]
            return q.astype(float), s.astype(float)
        q = self.q_ms * np.exp(self.sigma * rng.standard_normal(count))
        return q, np.full(count, float(self.s_ms))


def parse_classes(text: str) -> list[DeviceClass]:
    """Device classes from `name:q_ms:s_ms:weight,...` (weight optional, 1); ValueError saying what is wrong."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        fields = part.split(":")
        try:
            numbers = [float(x) for x in fields[1:]]
        except ValueError:
            numbers = []
        if len(numbers) not in (2, 3):
            raise ValueError(f"a device class is name:q_ms:s_ms[:weight], got {part!r}")
        out.append(DeviceClass(fields[0], *numbers))
    return out


class Population:
    """The workers alive in a simulation: their names, time laws and whether each is in the job.

    Workers are appended as they are drawn (the first ones at the start, the rest as they join) and
    never removed from the arrays: a worker that left or failed is only marked gone, so an index
    stays a worker's for the whole run."""

    def __init__(self, law: SpeedLaw, rng: np.random.Generator) -> None:
        self.law = law
        self.rng = rng
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.q = np.empty(0)
        self.s = np.empty(0)
        self.alive = np.empty(0, dtype=bool)

    def add(self, count: int) -> list[str]:
        """Draw `count` new workers; their names (w0, w1, ... in order of arrival)."""
        start = len(self.names)
        q, s = self.law.draw(count, self.rng, start)
        names = [f"w{start + i}" for i in range(count)]
        self.names.extend(names)
        self.index.update({n: start + i for i, n in enumerate(names)})
        self.q = np.concatenate([self.q, q])
        self.s = np.concatenate([self.s, s])
        self.alive = np.concatenate([self.alive, np.ones(count, dtype=bool)])
        return names

    def remove(self, names: Sequence[str]) -> None:
        for n in names:
            self.alive[self.index[n]] = False

    def living(self) -> list[str]:
        return [n for n, ok in zip(self.names, self.alive, strict=True) if ok]

    def pick(self, count: int, exclude: Collection[str] = ()) -> list[str]:
        """`count` living workers chosen at random (without replacement), none of `exclude`; fewer
        where fewer are left."""
        living = np.flatnonzero(self.alive)
        if exclude:
            living = np.setdiff1d(living, [self.index[n] for n in exclude])
        count = min(count, len(living))
        return [self.names[i] for i in sorted(self.rng.choice(living, size=count, replace=False))]

    def scale(self, factors: Mapping[str, float]) -> None:
        """Change speeds: each named worker's q and s times its factor (2: twice as slow)."""
        for n, f in factors.items():
            i = self.index[n]
            self.q[i] *= f
            self.s[i] *= f

    def expected_ms(self, idx: np.ndarray, batches: np.ndarray) -> np.ndarray:
        """The noise-free step times of the workers `idx` at `batches`."""
        return self.q[idx] * batches + self.s[idx]

    def step_ms(self, idx: np.ndarray, batches: np.ndarray) -> np.ndarray:
        """One step's measured times: the law times lognormal noise."""
        noise = np.exp(self.law.noise * self.rng.standard_normal(len(idx))) if self.law.noise else 1.0
        return self.expected_ms(idx, batches) * noise

"""Clusters of every regime drawn at random, to judge one default policy against the policies made
for each: time proportional to the batch, a fixed cost per step, and speeds that change (design §11,
"One default policy").

A cluster is N workers with laws t_k = q_k·b + s_k (ms; q_k lognormal around 0.5 ms a sample), a
global batch B = N × a batch per worker, a step's noise, and in the changing regimes one change a
third of the way in: the fastest and the slowest worker swap speeds (`swap`), one worker runs 2-4x
slower for the middle third (`tenant`), or a fifth to a half of the workers each run twice as slow or
twice as fast (`shift`). The fixed cost, where there is one, is a share of the worker's own
step at an equal split (a CPU share scales a worker's time per sample and its fixed cost alike).
Every law and every change is drawn here, from the seed, so that each policy meets the same
workers and the same change (the changed workers named in the event, not drawn by the run).

A cluster is judged by each policy's whole simulated time (every round, transitions included) over
the better of the others', and over the optimum's (each phase at its exact optimum from its first
round on, the server's cost included)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.simulation import metrics
from benchmarks.simulation.engine import Event, Scenario, Trace
from benchmarks.simulation.population import SpeedLaw

REGIMES = ("proportional", "fixed cost", "changing", "changing, fixed cost")
CHANGES = ("swap", "tenant", "shift")
SIZES = (2, 3, 4, 5, 6, 8, 12, 16, 32, 64)
PER_WORKER = (16, 32, 64, 128)
SPREADS = (0.3, 0.6, 1.0)
NOISES = (0.02, 0.05, 0.1)
Q_MS = 0.5
"""The median time per sample, ms."""


@dataclass(frozen=True)
class Cluster:
    """One drawn cluster: its regime, its workers' laws (q, s) in ms, B, the step's noise and its
    change (None: static) as the events that make it."""

    index: int
    regime: str
    laws: tuple[tuple[float, float], ...]
    global_batch: int
    noise: float
    spread: float
    fixed_share: float
    change: str | None
    events: tuple[Event, ...]

    @property
    def workers(self) -> int:
        return len(self.laws)

    def scenario(self, policy: str, rounds: int, adjust_every: int, seed: int) -> Scenario:
        """The cluster run by `policy` (the step's noise drawn from `seed`)."""
        law = SpeedLaw(q_ms=Q_MS, s_ms=0.0, sigma=0.0, noise=self.noise, given=self.laws)
        return Scenario(policy=policy, workers=self.workers, global_batch=self.global_batch, rounds=rounds,
                        adjust_every=adjust_every, law=law, seed=seed, events=self.events)

    def describe(self) -> dict[str, Any]:
        return {"cluster": self.index, "regime": self.regime, "change": self.change, "workers": self.workers,
                "global_batch": self.global_batch, "spread": self.spread, "fixed_share": self.fixed_share,
                "noise": self.noise}


def _change(kind: str, q: np.ndarray, rounds: int, rng: np.random.Generator) -> tuple[Event, ...]:
    """The events of a change of `kind` among workers of times per sample `q`."""
    at = rounds // 3
    if kind == "swap":
        fast, slow = int(np.argmin(q)), int(np.argmax(q))
        ratio = float(q[slow] / q[fast])
        return (Event(at, "speed", scaled=((f"w{fast}", ratio), (f"w{slow}", 1.0 / ratio))),)
    if kind == "tenant":
        k, factor = int(rng.integers(len(q))), float(rng.uniform(2.0, 4.0))
        return (Event(at, "speed", scaled=((f"w{k}", factor),)),
                Event(2 * at, "speed", scaled=((f"w{k}", 1.0 / factor),)))
    count = max(1, round(float(rng.uniform(0.2, 0.5)) * len(q)))
    chosen = sorted(rng.choice(len(q), size=count, replace=False).tolist())
    return (Event(at, "speed", scaled=tuple((f"w{k}", float(rng.choice([2.0, 0.5]))) for k in chosen)),)


def draw(count: int, seed: int, rounds: int) -> list[Cluster]:
    """`count` clusters, the regimes in turn, everything else drawn from `seed`."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        regime = REGIMES[i % len(REGIMES)]
        n, per = int(rng.choice(SIZES)), int(rng.choice(PER_WORKER))
        spread, noise = float(rng.choice(SPREADS)), float(rng.choice(NOISES))
        q = Q_MS * np.exp(spread * rng.standard_normal(n))
        share = float(rng.uniform(0.2, 3.0)) if "fixed cost" in regime else 0.0
        s = share * q * per * rng.uniform(0.5, 1.5, n)
        change = str(rng.choice(CHANGES)) if regime.startswith("changing") else None
        events = _change(change, q, rounds, rng) if change else ()
        laws = tuple((float(a), float(b)) for a, b in zip(q, s, strict=True))
        out.append(Cluster(i, regime, laws, n * per, noise, spread, round(share, 3), change, events))
    return out


def optimum_ms(trace: Trace) -> float:
    """The run's rounds each at its phase's exact optimum, the server's cost included."""
    sc, total = trace.scenario, 0.0
    for start, end in metrics.phases(trace):
        best = trace.optimum_at(start)
        total += (end - start) * (best.round_ms + sc.server_ms(int(np.count_nonzero(best.batches))))
    return total


def judge(cluster: Cluster, totals: Mapping[str, float], optimum: float, default: str) -> dict[str, Any]:
    """A cluster's record: each policy's simulated time (s) and over the optimum's, and the default's
    over the better of the others'."""
    others = [t for p, t in totals.items() if p != default]
    return {**cluster.describe(),
            "seconds": {p: round(t / 1000.0, 3) for p, t in totals.items()},
            "over_optimum": {p: round(t / optimum, 4) for p, t in totals.items()},
            "default_over_better": round(totals[default] / min(others), 4) if others else None}


def geometric_mean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def summary(records: Sequence[Mapping[str, Any]], policies: Sequence[str]) -> list[dict[str, Any]]:
    """Per regime and over all: the clusters, the default over the better of the others (geometric
    mean, worst, how many lose more than 2%), and each policy's time over the optimum's (geometric mean)."""
    rows = []
    for regime in (*REGIMES, "all"):
        mine = [r for r in records if regime in ("all", r["regime"])]
        if not mine:
            continue
        ratios = [r["default_over_better"] for r in mine if r["default_over_better"] is not None]
        rows.append({
            "regime": regime, "clusters": len(mine),
            "default_over_better": round(geometric_mean(ratios), 4) if ratios else None,
            "worst": max(ratios) if ratios else None,
            "lost_over_2pct": sum(v > 1.02 for v in ratios),
            "over_optimum": {p: round(geometric_mean([r["over_optimum"][p] for r in mine]), 4) for p in policies},
        })
    return rows

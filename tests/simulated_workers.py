"""Batch policies over simulated workers, for the tests of ps/control: a policy with workers w0..,
their observations at given speeds, running it to a steady plan, and what a balanced plan is; BSP
rounds of workers with a per-sample and a fixed cost, and the optimum round they allow."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pytest

from ps.control.config import PolicyConfig
from ps.control.model.optperf import best_plan
from ps.control.policy import build_policy
from ps.control.worker_plan import WorkerPlan

HL_SPEEDS: dict[str, Sequence[float]] = {
    "slowdowns-1-1-2-4": (1.0, 1.0, 0.5, 0.25),
    "HL2": (12.0, 12.0, 8.0, 16.0),
    "HL4": (9.0, 9.0, 6.0, 24.0),
    "HL8": (6.0, 6.0, 4.0, 32.0),
}


# ---------------------------------------------------------------- helpers


def make_policy(n: int = 0, cores: Sequence[float] | None = None, **config: Any) -> WorkerPlan:
    """A policy with workers w0..w{n-1} (or one per entry of `cores`), not yet planned: the dynamic
    policy unless `config` names another. The rules are tested on one observation per worker
    (min_samples 1) unless `config` says otherwise."""
    ctl = build_policy(PolicyConfig(**{"policy": "dynamic", "min_samples": 1, **config}))
    for i, c in enumerate(cores if cores is not None else [1.0] * n):
        ctl.add_worker(f"w{i}", cores=c)
    return ctl


def speed_map(speeds: Sequence[float]) -> dict[str, float]:
    """Speeds (samples per ms) keyed like `make_policy`'s workers."""
    return {f"w{i}": s for i, s in enumerate(speeds)}


def observe_all(ctl: WorkerPlan, speeds: Mapping[str, float], intercept: float = 0.0) -> None:
    """One step of every worker under the simulated cost model t_k = b_k / speed_k + intercept."""
    for k, b in ctl.plan().items():
        ctl.observe(k, b, b / speeds[k] + intercept)


def run_to_steady(ctl: WorkerPlan, speeds: Mapping[str, float], intercept: float = 0.0) -> int:
    """Alternate one observed step and one `adjust` until an adjust changes nothing; return the adjustments."""
    for _ in range(40):
        observe_all(ctl, speeds, intercept)
        before = ctl.adjustments
        ctl.adjust()
        if ctl.adjustments == before:
            return ctl.adjustments
    pytest.fail(f"policy did not settle: plan {ctl.plan()}")


def balanced(plan: Mapping[str, int], speeds: Mapping[str, float], intercept: float, deadband: float) -> bool:
    """Every worker's compute time is within the deadband of the mean, up to integer rounding.

    Rounding slack: one sample on the worker itself (1/speed_k) plus the shift of the mean if
    every worker is one sample off (mean of 1/speed_j).
    """
    times = {k: b / speeds[k] + intercept for k, b in plan.items()}
    mean = sum(times.values()) / len(times)
    slack = sum(1.0 / speeds[k] for k in plan) / len(plan)
    return all(abs(t - mean) <= deadband * mean + 1.0 / speeds[k] + slack for k, t in times.items())


def water_level(
    targets: Mapping[str, float], total: int, lower: Mapping[str, int], upper: Mapping[str, int]
) -> dict[str, float]:
    """Independent oracle for fit_to_sum's real-valued solution: bisect the common scale s of clip(s*t, lo, hi)."""

    def filled(s: float) -> float:
        return sum(min(upper[k], max(lower[k], s * t)) for k, t in targets.items())

    lo_s, hi_s = 0.0, 1.0
    while filled(hi_s) < total:
        hi_s *= 2.0
    for _ in range(200):
        mid = (lo_s + hi_s) / 2.0
        lo_s, hi_s = (mid, hi_s) if filled(mid) < total else (lo_s, mid)
    return {k: min(upper[k], max(lower[k], hi_s * t)) for k, t in targets.items()}


def snapshot(ctl: WorkerPlan) -> str:
    """Canonical JSON of the full state, to compare before/after."""
    return json.dumps(ctl.state_dict(), sort_keys=True)




Costs = Mapping[str, tuple[float, float]]
"""Each worker's simulated step time t(b) = q·b + s, as (q, s) in ms."""
HL8_MEASURED: Costs = {"w0": (6.3, 200.0), "w1": (5.5, 233.0), "w2": (10.7, 212.0), "w3": (1.5, 25.0)}
"""(q, s) the model policy fitted on HL8 here (3/16, 3/16, 1/8 and 1 core; benchmarks.hetero): the
fixed costs grow as the share falls."""


def run_rounds(ctl: Any, costs: Costs, rounds: int, noise: float = 0.02, rnd: random.Random | None = None,
               overhead: float = 2.0, every: int = 10,
               check: Callable[[Any], None] | None = None) -> list[dict[str, Any]]:
    """Simulate BSP rounds: every worker with a batch takes t = q·b + s times (1 + a Gaussian of
    relative sd `noise`), the round closes `overhead` ms after the slowest; a decision whenever the
    policy asks for one and every `every` rounds, and `check` of the policy after every round. Returns
    each decision's report with the plan after it, the round it came at (`round`) and whether it
    changed the plan (`changed_plan`)."""
    rnd = rnd or random.Random(0)
    reports = []
    for r in range(rounds):
        finishes = []
        for k, b in ctl.plan().items():
            if b > 0:
                q, s = costs[k]
                t = max(0.0, (q * b + s) * (1.0 + rnd.gauss(0.0, noise)))
                finishes.append(t)
                ctl.observe(k, b, t)
        ctl.observe_round(max(finishes) + overhead)
        if ctl.decision_due() or r % every == every - 1:
            before = ctl.plan()
            ctl.adjust()
            reports.append({**ctl.report(), "plan": ctl.plan(), "round": r, "changed_plan": ctl.plan() != before})
        if check is not None:
            check(ctl)
    return reports


def round_of(costs: Costs, plan: Mapping[str, int]) -> float:
    """The simulated round of `plan` without noise: its slowest finish."""
    return max(costs[k][0] * b + costs[k][1] for k, b in plan.items() if b > 0)


def optimum(costs: Costs, total: int, park: bool = True) -> float:
    """The shortest round any split of `total` gives (every batch >= 1, or 0 where `park`)."""
    times = {k: (lambda b, q=q, s=s: q * b + s) for k, (q, s) in costs.items()}
    plan, _, _ = best_plan(times, total, dict.fromkeys(costs, 1), dict.fromkeys(costs, total),
                           may_park=list(costs) if park else [])
    return round_of(costs, plan)


def assert_decides_alike(resumed: Sequence[Mapping[str, Any]], original: Sequence[Mapping[str, Any]],
                         workers: Iterable[str]) -> None:
    """A policy read back from a checkpoint decides like the original over the same rounds: the same
    phases and parked workers, each plan within rounding (2 samples a worker)."""
    assert [(r["phase"], r["parked"]) for r in resumed] == [(r["phase"], r["parked"]) for r in original]
    names = list(workers)
    for r, o in zip(resumed, original, strict=True):
        assert all(abs(r["plan"][k] - o["plan"][k]) <= 2 for k in names)


QUICK_START = {"w0": (0.05, 9.0), "w1": (0.05, 9.0), "w2": (0.05, 9.0), "w3": (0.2, 40.0)}
"""The quick start's shape: nearly all fixed cost, and a slow worker that cannot pay for itself."""


def auto_policy(costs: Costs, total: int) -> Any:
    """The auto policy over workers named as `costs`, planned at B = `total`."""
    ctl = build_policy(PolicyConfig(policy="auto", global_batch=total))
    for k in costs:
        ctl.add_worker(k)
    ctl.replan()
    return ctl


def parked_then(before: Costs, after: Costs, parked: str, total: int, seed: int,
                noise: float = 0.05) -> list[dict[str, Any]]:
    """The decisions (waits aside) after `before` turns into `after`, from the first that plans the
    worker `parked` under `before` back in."""
    rnd = random.Random(seed)
    ctl = auto_policy(before, total)
    run_rounds(ctl, before, 60, rnd=rnd, noise=noise)
    assert ctl.parked() == [parked]
    reports = [r for r in run_rounds(ctl, after, 80, rnd=rnd, noise=noise, every=8) if r["phase"] != "wait"]
    back = next(i for i, r in enumerate(reports) if r["plan"][parked] > 0)
    return reports[back:]

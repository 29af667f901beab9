"""The model policy on simulated BSP rounds, as its tests run it: a policy over given per-worker
costs, rounds with noise and a decision schedule, and the plan's sum and bounds checked after each."""

from __future__ import annotations

import random
from collections.abc import Mapping

from ps.control.config import PolicyConfig
from ps.control.policy import build_policy
from ps.control.worker_plan import WorkerPlan
from tests.simulated_workers import run_rounds


def model(costs: Mapping[str, tuple[float, float]], global_batch: int, **config: object) -> WorkerPlan:
    ctl = build_policy(PolicyConfig(policy="model", global_batch=global_batch, **config))  # type: ignore[arg-type]
    for k in costs:
        ctl.add_worker(k)
    ctl.replan()
    return ctl


def run(ctl: WorkerPlan, costs: Mapping[str, tuple[float, float]], rounds: int, noise: float = 0.02, seed: int = 0,
        overhead: float = 2.0, every: int = 10) -> list[dict]:
    """Simulate BSP rounds (t = q·b + s, relative noise), a decision when the policy asks for one and every
    `every` rounds; check the sum rule and the bounds after each; return the decisions' reports."""
    return run_rounds(ctl, costs, rounds, noise, random.Random(seed), overhead, every, check=check_plan)


def check_plan(ctl: WorkerPlan) -> None:
    """Σb = B over every worker, each within its bounds unless parked (b = 0, only where parking is on)."""
    state = ctl.state_dict()
    assert sum(ctl.plan().values()) == ctl.config.global_batch
    for w in state["workers"]:
        if w["batch"] == 0:
            assert ctl.config.park and ctl.config.keep_global_sum
        else:
            assert w["min_batch"] <= w["batch"] <= w["max_batch"]
    assert sum(b > 0 for b in ctl.plan().values()) >= 1

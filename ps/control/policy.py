"""The batch policy as ps/rounds sees it, the whole contract: the interface (BatchPolicy: told who
joined and left and what each push and each round took, asked for the plan, each worker's batch
summing to the global batch B in BSP, 0 for a parked worker; asked to decide at the granularity the
server chooses or when the policy says a decision is due, what its last decision was based on, what
global batches its workers can make up and how long a round of one would take; saved in checkpoints),
and the functions that build a policy by name (from ps/control/registry.py), read one back from a
checkpoint and move one under new settings. Every policy (a ps/control/worker_plan.py subclass, or
micro.py's wrapper of one) is a BatchPolicy; ps/rounds imports none of them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Protocol

from ps.control.config import PolicyConfig
from ps.control.micro import STATE_KEY, MicroBatched, from_state
from ps.control.registry import POLICIES, policy_class
from ps.control.worker_plan import WorkerPlan


class BatchPolicy(Protocol):
    """What ps/rounds calls on a batch policy."""

    @property
    def config(self) -> PolicyConfig:
        """The settings (their policy name is what Status and the summary report)."""

    @property
    def adjustments(self) -> int:
        """How many decisions changed the plan."""

    def workers(self) -> list[str]:
        """The workers in the plan, by name."""

    def can_add(self, count: int = 1) -> bool:
        """Whether `count` more workers would still each get their minimum batch."""

    def add_worker(self, worker_id: str, cores: float = 1.0, min_batch: int | None = None,
                   max_batch: int | None = None) -> None:
        """A worker joins (its share of B comes at the next `replan`)."""

    def remove_worker(self, worker_id: str) -> None:
        """A worker left or was evicted."""

    def replan(self) -> dict[str, int]:
        """Split B over the current workers; the plan."""

    def plan(self) -> dict[str, int]:
        """Each worker's batch (0: parked, it skips rounds)."""

    def parked(self) -> list[str]:
        """The workers planned at batch 0."""

    def observe(self, worker_id: str, batch: int, compute_ms: float, exposed_ms: float = 0.0) -> None:
        """What a push of `batch` samples took: the time the policy balances, and `exposed_ms`, the
        communication the worker waited for between its last backward and this forward (ms; 0 when
        not measured, as on ASP and the --allreduce fast path)."""

    def observe_round(self, round_ms: float, push_ms: float = 0.0) -> None:
        """A BSP round closed, `round_ms` after the previous one (the server's clock); `push_ms`: the
        server's CPU over the round per push in it (0: not measured)."""

    def smoothed_ms(self) -> dict[str, float | None]:
        """Each worker's smoothed time at its current batch (None: not measured yet)."""

    def decision_due(self) -> bool:
        """Whether the policy wants a decision now, ahead of the server's schedule."""

    def adjust(self) -> dict[str, int]:
        """One decision; the (possibly unchanged) plan."""

    def report(self) -> dict[str, Any]:
        """What the last decision or replan was based on: fields for its `adjust` record."""

    def global_batch_range(self) -> tuple[int, int | None]:
        """The global batches the workers' bounds can make up, [lower, upper] (upper None: no bound
        but the flags'); --adaptive-batch keeps to it."""

    def predicted_round_ms(self, total: int) -> float | None:
        """The predicted round (ms) at a global batch of `total` (ps/control/performance.py); None
        where the policy has no fitted model of its workers."""

    def predicted_plan(self, total: int) -> dict[str, int] | None:
        """The plan `predicted_round_ms(total)` prices (which workers a B would train); None where
        that is None."""

    def state_dict(self) -> dict[str, Any]:
        """The whole state, as plain data, for a checkpoint."""


def build_policy(config: PolicyConfig) -> BatchPolicy:
    """A new policy of the kind `config.policy` names, with no workers (planning whole micro-batches
    when `config.micro_batch` > 1)."""
    if not isinstance(config, PolicyConfig):
        raise ValueError(f"config must be a PolicyConfig, got {type(config).__name__}")
    cls = policy_class(config.policy)
    if config.micro_batch > 1:
        return MicroBatched(config, cls)
    return cls(config)  # type: ignore[no-any-return]


def policy_from_state(state: Mapping[str, Any]) -> BatchPolicy:
    """The policy a checkpoint's policy state describes (its config names the kind); ValueError,
    saying what is wrong, on a state no policy here can read."""
    if not isinstance(state, Mapping):
        raise ValueError(f"policy state must be a mapping, got {type(state).__name__}")
    config = state.get("config")
    name = config.get("policy", "dynamic") if isinstance(config, Mapping) else None
    if name not in POLICIES:
        raise ValueError(f"the policy state names policy {name!r}, which this server does not have "
                         f"(it has {', '.join(POLICIES)})")
    if STATE_KEY in state:
        return from_state(state)
    return policy_class(name).from_state_dict(state)  # type: ignore[no-any-return]


def reconfigured(policy: BatchPolicy, config: PolicyConfig) -> BatchPolicy:
    """A policy of `config`'s kind over `policy`'s workers and measurements (`adopt`): a resume
    whose command line differs from the checkpoint's. The same config gives a copy. From a
    micro-batched policy to one without: the workers only, split anew."""
    fresh = build_policy(config)
    assert isinstance(fresh, (WorkerPlan, MicroBatched)) and isinstance(policy, (WorkerPlan, MicroBatched))
    if isinstance(fresh, WorkerPlan) and isinstance(policy, MicroBatched):
        for wid, cores, lo, hi in policy.worker_bounds():
            fresh.add_worker(wid, cores, lo, hi)
        fresh.replan()
    else:
        fresh.adopt(policy)  # type: ignore[arg-type]
    return fresh


def with_global_batch(policy: BatchPolicy, global_batch: int) -> BatchPolicy:
    """The policy over the same workers and measurements at another global batch, re-split with an
    exact sum within the workers' bounds (--adaptive-batch); ValueError if the bounds cannot make it up."""
    return reconfigured(policy, replace(policy.config, global_batch=global_batch))

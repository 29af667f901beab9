"""Plans in whole micro-batches (`--micro-batch m`, JABAS-style): every worker's batch is k·m with an
integer k >= 1 (0 for a parked worker) and Σ k·m = B exactly.

Done once for every policy: `MicroBatched` runs the policy on workers whose unit is one micro-batch
(its global batch B/m, each worker's bounds ceil(min/m) and floor(max/m) micro-batches) and speaks
samples to the coordinator, so the exact-sum split, water-filling, the proportional law, the model
policy's time fits and parking all plan k and never see a sample count that m does not divide. A
push's batch is told to the policy in micro-batches; its time is left as it is (a time per unit
of m samples is a time per sample scaled by m, which every policy's law is invariant to).
Pure: no torch, no gRPC, no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, replace
from typing import Any

from ps.control.config import PolicyConfig
from ps.control.registry import POLICIES, policy_class
from ps.control.worker_plan import WorkerPlan

STATE_KEY = "micro"
"""The key of a micro-batched policy's own part in its state dict (beside the unit policy's keys)."""


def unit_config(config: PolicyConfig) -> PolicyConfig:
    """`config` in micro-batches: B/m, min ceil(min/m), max floor(max/m), and micro_batch 1."""
    m = config.micro_batch
    return replace(config, global_batch=config.global_batch // m, min_batch=math.ceil(config.min_batch / m),
                   max_batch=None if config.max_batch is None else config.max_batch // m, micro_batch=1)


def usable_max(config: PolicyConfig, max_batch: int | None) -> int:
    """The most samples a worker declaring `max_batch` (None: the job's default) can be planned:
    its bound, or the job's if that is lower, in whole micro-batches."""
    bound = config.default_max_batch if max_batch is None else min(max_batch, config.default_max_batch)
    return bound // config.micro_batch * config.micro_batch


class MicroBatched:
    """A batch policy (ps/control/policy.py) that plans its inner policy's units as micro-batches."""

    def __init__(self, config: PolicyConfig, policy: type[WorkerPlan]) -> None:
        if config.micro_batch < 2:
            raise ValueError(f"a micro-batched policy needs micro_batch >= 2, got {config.micro_batch}")
        self._config = config
        self._m = config.micro_batch
        self._inner = policy(unit_config(config))
        self._inner.round_for_time = True

    # ------------------------------------------------------------------ samples <-> micro-batches
    def _samples(self, plan: Mapping[str, int]) -> dict[str, int]:
        return {k: b * self._m for k, b in plan.items()}

    def _units(self, worker_id: str, what: str, value: int | None, rounding: str) -> int | None:
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{what} of {worker_id!r} must be a whole number >= 1, got {value!r}")
        return math.ceil(value / self._m) if rounding == "up" else value // self._m

    # ------------------------------------------------------------------ the BatchPolicy interface
    @property
    def config(self) -> PolicyConfig:
        """The settings in samples (as the command line gave them)."""
        return self._config

    @property
    def inner(self) -> WorkerPlan:
        """The policy planning micro-batches."""
        return self._inner

    @property
    def adjustments(self) -> int:
        return self._inner.adjustments

    def workers(self) -> list[str]:
        return self._inner.workers()

    def can_add(self, count: int = 1) -> bool:
        return self._inner.can_add(count)

    def add_worker(self, worker_id: str, cores: float = 1.0, min_batch: int | None = None,
                   max_batch: int | None = None) -> None:
        """Register a worker; its bounds in samples become whole micro-batches (min rounded up, max
        down). Raises ValueError, changing nothing, if its max_batch is below one micro-batch."""
        hi = self._units(worker_id, "max_batch", max_batch, "down")
        if hi == 0:
            raise ValueError(f"worker {worker_id!r}: max_batch {max_batch} is below the micro-batch {self._m}")
        self._inner.add_worker(worker_id, cores, self._units(worker_id, "min_batch", min_batch, "up"), hi)

    def remove_worker(self, worker_id: str) -> None:
        self._inner.remove_worker(worker_id)

    def replan(self) -> dict[str, int]:
        return self._samples(self._inner.replan())

    def plan(self) -> dict[str, int]:
        return self._samples(self._inner.plan())

    def parked(self) -> list[str]:
        return self._inner.parked()

    def observe(self, worker_id: str, batch: int, compute_ms: float, exposed_ms: float = 0.0) -> None:
        """A push of `batch` samples, which must be whole micro-batches (ValueError otherwise)."""
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1 or batch % self._m:
            raise ValueError(f"batch {batch!r} of {worker_id!r} is not a whole number of micro-batches of {self._m}")
        self._inner.observe(worker_id, batch // self._m, compute_ms, exposed_ms)

    def observe_round(self, round_ms: float, push_ms: float = 0.0) -> None:
        self._inner.observe_round(round_ms, push_ms)

    def smoothed_ms(self) -> dict[str, float | None]:
        return self._inner.smoothed_ms()

    def decision_due(self) -> bool:
        return self._inner.decision_due()

    def adjust(self) -> dict[str, int]:
        return self._samples(self._inner.adjust())

    def report(self) -> dict[str, Any]:
        """The inner policy's report (its fits are per micro-batch), and the micro-batch."""
        return {**self._inner.report(), "micro_batch": self._m}

    def global_batch_range(self) -> tuple[int, int | None]:
        """The inner policy's range in samples."""
        lower, upper = self._inner.global_batch_range()
        return lower * self._m, None if upper is None else upper * self._m

    def predicted_round_ms(self, total: int) -> float | None:
        """The inner policy's prediction at `total` samples, a whole number of micro-batches (None otherwise)."""
        return None if total % self._m else self._inner.predicted_round_ms(total // self._m)

    def predicted_plan(self, total: int) -> dict[str, int] | None:
        """The inner policy's plan at `total` samples, in samples (None where `predicted_round_ms` is)."""
        plan = None if total % self._m else self._inner.predicted_plan(total // self._m)
        return None if plan is None else self._samples(plan)

    def state_dict(self) -> dict[str, Any]:
        """The unit policy's state, and under `STATE_KEY` the micro-batch and the settings in samples."""
        return {**self._inner.state_dict(), STATE_KEY: {"micro_batch": self._m, "config": asdict(self._config)}}

    def worker_bounds(self) -> list[tuple[str, float, int | None, int | None]]:
        """(id, cores, min_batch, max_batch) per worker in samples (None: the config's default)."""
        return [(k, c, None if lo is None else lo * self._m, None if hi is None else hi * self._m)
                for k, c, lo, hi in self._inner.worker_bounds()]

    def adopt(self, old: WorkerPlan | MicroBatched) -> None:
        """Take `old`'s workers into this fresh policy (a resume under new settings): its measurements
        too when it planned the same micro-batch, else only the workers (a new split)."""
        if isinstance(old, MicroBatched) and old._m == self._m:
            self._inner.adopt(old._inner)
            return
        if self._inner.workers():
            raise ValueError("adopt() takes the workers into a policy that has none yet")
        for wid, cores, lo, hi in old.worker_bounds():
            self.add_worker(wid, cores, lo, hi)
        self.replan()


def from_state(state: Mapping[str, Any]) -> MicroBatched:
    """Rebuild a micro-batched policy from its `state_dict` (ValueError on one that is malformed)."""
    own = state[STATE_KEY]
    if not isinstance(own, Mapping) or set(own) != {"micro_batch", "config"} or not isinstance(own["config"], Mapping):
        raise ValueError(f"policy state {STATE_KEY!r} must have exactly the keys config and micro_batch")
    try:
        config = PolicyConfig(**own["config"])
    except TypeError as exc:
        raise ValueError(f"bad policy config in state: {exc}") from None
    if config.micro_batch != own["micro_batch"] or config.policy not in POLICIES:
        raise ValueError("policy state: the micro-batch or policy of its config does not match")
    fresh = MicroBatched(config, policy_class(config.policy))
    inner = policy_class(config.policy).from_state_dict({k: v for k, v in state.items() if k != STATE_KEY})
    if inner.config != unit_config(config):
        raise ValueError("policy state: the unit policy's config is not its settings in micro-batches")
    inner.round_for_time = True
    fresh._inner = inner
    return fresh

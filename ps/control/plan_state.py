"""The state every batch policy shares, as plain JSON-serialisable data for checkpoints: the format
version, the settings, each worker's record and the count of decisions that changed the plan; and
reading it back with every value checked, so that a state that contradicts itself or holds garbage is
refused with the field it names (ValueError). A policy's own keys sit beside these (its
`extra_state_keys`). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from ps.control.checks import integer, positive, real
from ps.control.config import PolicyConfig
from ps.control.worker_record import Worker

STATE_VERSION = 1
"""Format version written by `plan_state` and required by `read_config`."""

WORKER_KEYS = frozenset({"id", "cores", "min_batch", "max_batch", "batch", "ewma_ms", "throughput"})
OPTIONAL_WORKER_KEYS = frozenset({"samples"})  # absent from states written before it was kept
STATE_KEYS = frozenset({"version", "config", "workers", "adjustments"})


def plan_state(config: PolicyConfig, workers: Mapping[str, Worker], adjustments: int) -> dict[str, Any]:
    """The shared part of a policy's state."""
    return {
        "version": STATE_VERSION,
        "config": asdict(config),
        "workers": [
            {
                "id": k,
                "cores": w.cores,
                "min_batch": w.min_batch,
                "max_batch": w.max_batch,
                "batch": w.batch,
                "ewma_ms": w.ewma_ms,
                "throughput": w.throughput,
                "samples": w.samples,
            }
            for k, w in workers.items()
        ],
        "adjustments": adjustments,
    }


def read_config(state: Any, extra_keys: frozenset[str]) -> PolicyConfig:
    """The settings of `state`, once its keys (the shared ones and `extra_keys`) and version are checked."""
    if not isinstance(state, Mapping):
        raise ValueError(f"policy state must be a mapping, got {type(state).__name__}")
    if not STATE_KEYS <= set(state) <= STATE_KEYS | extra_keys:
        raise ValueError(f"policy state must have exactly the keys {sorted(STATE_KEYS | extra_keys)}, "
                         f"got {sorted(state)}")
    if state["version"] != STATE_VERSION:
        raise ValueError(f"unsupported policy state version {state['version']!r} (expected {STATE_VERSION})")
    raw_config = state["config"]
    if not isinstance(raw_config, Mapping):
        raise ValueError("policy state 'config' must be a mapping")
    try:
        return PolicyConfig(**raw_config)
    except TypeError as exc:
        raise ValueError(f"bad policy config in state: {exc}") from None


def worker_entries(state: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The worker entries of `state`, each with the keys a worker record is read from."""
    entries = state["workers"]
    if not isinstance(entries, list):
        raise ValueError("policy state 'workers' must be a list")
    for entry in entries:
        if not isinstance(entry, Mapping) or not WORKER_KEYS <= set(entry) <= WORKER_KEYS | OPTIONAL_WORKER_KEYS:
            raise ValueError(f"each worker entry must have exactly the keys {sorted(WORKER_KEYS)} "
                             f"(and optionally {sorted(OPTIONAL_WORKER_KEYS)})")
    return entries


def restore_worker(worker_id: str, w: Worker, entry: Mapping[str, Any], config: PolicyConfig, may_park: bool) -> None:
    """Validate and set the measured part of `w` (registered with the entry's cores and bounds) from
    its `entry`; `may_park`: a batch of 0 is a parked worker's. A state from before `samples` was
    kept counts its smoothed times as settled."""
    batch, ewma_ms, throughput = entry["batch"], entry["ewma_ms"], entry["throughput"]
    samples = entry.get("samples", config.min_samples if ewma_ms is not None else 0)
    if batch is not None:
        w.batch = integer(f"batch of {worker_id!r}", batch)
        parked = w.batch == 0 and may_park
        if not (parked or w.min_batch <= w.batch <= w.max_batch):
            raise ValueError(f"batch {w.batch} of {worker_id!r} is outside [{w.min_batch}, {w.max_batch}]")
    if ewma_ms is not None:
        if batch is None:
            raise ValueError(f"worker {worker_id!r} has a smoothed time but no batch")
        w.ewma_ms = real(f"ewma_ms of {worker_id!r}", ewma_ms)
        if w.ewma_ms < 0:
            raise ValueError(f"ewma_ms of {worker_id!r} must be >= 0, got {w.ewma_ms}")
    if throughput is not None:
        w.throughput = positive(f"throughput of {worker_id!r}", throughput)
    w.samples = integer(f"samples of {worker_id!r}", samples, minimum=0)
    if w.samples and w.ewma_ms is None:
        raise ValueError(f"worker {worker_id!r} has {w.samples} samples but no smoothed time")


def check_planned_sum(plan: Mapping[str, int], config: PolicyConfig) -> None:
    """Under `keep_global_sum`, the planned batches read back must not exceed B."""
    if config.keep_global_sum:
        planned = sum(plan.values())
        if planned > config.global_batch:
            raise ValueError(f"planned batches sum to {planned} > global_batch {config.global_batch}")

"""The batch policies by `--controller` name: how the server builds one, how a checkpoint's state is
read back into the policy that wrote it, and how a resume moves a saved policy's workers and
measurements under new settings (another policy included).

Adding a policy: a module with a `Roster` subclass, a line here and its name in config.POLICIES;
the coordinator and the servicer know policies only through policy.BatchPolicy."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ps.control.config import ControllerConfig
from ps.control.dynamic import DynamicPolicy
from ps.control.micro import STATE_KEY, MicroBatched, from_state
from ps.control.model import ModelPolicy
from ps.control.roster import Roster
from ps.control.static import StaticPolicy
from ps.control.uniform import UniformPolicy

POLICIES: dict[str, type[Roster]] = {
    UniformPolicy.name: UniformPolicy,
    StaticPolicy.name: StaticPolicy,
    DynamicPolicy.name: DynamicPolicy,
    ModelPolicy.name: ModelPolicy,
}


def build_policy(config: ControllerConfig) -> Roster | MicroBatched:
    """A new policy of the kind `config.policy` names, with no workers (planning whole micro-batches
    when `config.micro_batch` > 1)."""
    if not isinstance(config, ControllerConfig):
        raise ValueError(f"config must be a ControllerConfig, got {type(config).__name__}")
    if config.micro_batch > 1:
        return MicroBatched(config, POLICIES[config.policy])
    return POLICIES[config.policy](config)


def policy_from_state(state: Mapping[str, Any]) -> Roster | MicroBatched:
    """The policy a checkpoint's controller state describes (its config names the kind); ValueError,
    saying what is wrong, on a state no policy here can read."""
    if not isinstance(state, Mapping):
        raise ValueError(f"controller state must be a mapping, got {type(state).__name__}")
    config = state.get("config")
    name = config.get("policy", "dynamic") if isinstance(config, Mapping) else None
    if name not in POLICIES:
        raise ValueError(f"the controller state names policy {name!r}, which this server does not have "
                         f"(it has {', '.join(POLICIES)})")
    if STATE_KEY in state:
        return from_state(state, POLICIES)
    return POLICIES[name].from_state_dict(state)


def reconfigured(policy: Roster | MicroBatched, config: ControllerConfig) -> Roster | MicroBatched:
    """A policy of `config`'s kind over `policy`'s workers and measurements (Roster.adopt): a resume
    whose command line differs from the checkpoint's. The same config gives a copy. From a
    micro-batched policy to one without: the workers only, split anew."""
    fresh = build_policy(config)
    if isinstance(fresh, Roster) and isinstance(policy, MicroBatched):
        for wid, cores, lo, hi in policy.worker_bounds():
            fresh.add_worker(wid, cores, lo, hi)
        fresh.replan()
    else:
        fresh.adopt(policy)  # type: ignore[arg-type]
    return fresh


def with_global_batch(policy: Roster, global_batch: int) -> Roster:
    """The policy over the same workers and measurements at another global batch, re-split with an
    exact sum within the workers' bounds (--adaptive-batch); ValueError if the bounds cannot make it up."""
    return reconfigured(policy, replace(policy.config, global_batch=global_batch))

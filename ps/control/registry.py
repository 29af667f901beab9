"""Every batch policy by name (`--policy`), and where its class is. The one list of policies: the
flags' choices and the flags of each policy's own settings, PolicyConfig's check and
ps.control.policy.build_policy all read it.

Adding a policy: a module with a `ps.control.worker_plan.WorkerPlan` subclass (its `name`, how B is
split, `_plan_weights`, what a decision does, `_decide`, and the `settings` of its own, if any) and
its line in POLICIES. Each class is named by its path and imported on first use, so this list imports
none of them (they import the settings, which check names against it). Pure."""

from __future__ import annotations

import importlib
from functools import cache
from typing import Any

from ps.control.settings import Setting

POLICIES: dict[str, str] = {
    "uniform": "ps.control.uniform:UniformPolicy",
    "static": "ps.control.static:StaticPolicy",
    "dynamic": "ps.control.dynamic:DynamicPolicy",
    "model": "ps.control.model.policy:ModelPolicy",
    "auto": "ps.control.auto.policy:AutoPolicy",
}
"""Policy name -> its class, as module:Class."""


def policy_class(name: str) -> Any:
    """The class of the policy `name` (ValueError naming the choices for one not in POLICIES)."""
    if name not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}; got {name!r}")
    return _load(POLICIES[name])


def policy_settings(name: str) -> tuple[Setting, ...]:
    """The settings the policy `name` declares for itself (ps.control.settings)."""
    return tuple(policy_class(name).settings)


@cache
def _load(path: str) -> Any:
    module, _, attr = path.partition(":")
    cls = getattr(importlib.import_module(module), attr)
    if getattr(cls, "name", None) not in POLICIES or POLICIES[cls.name] != path:
        raise ValueError(f"the class at {path} does not carry its registry name (its `name` is {getattr(cls, 'name', None)!r})")
    return cls

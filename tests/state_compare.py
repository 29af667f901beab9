"""Bit-exact comparison of server-state snapshots (a refused request must change nothing)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

from ps.rounds.coordinator import Coordinator


def assert_same(a: Any, b: Any, path: str = "state") -> None:
    """Deep equality where tensors must match bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{path}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def member_fields(member: Any) -> dict[str, Any]:
    """A member's plain fields (its asyncio.Event is not state worth comparing)."""
    return {f.name: getattr(member, f.name) for f in dataclasses.fields(member) if f.name != "activated"}


def server_state(c: Coordinator, *, with_accuracy: bool = True) -> dict[str, Any]:
    """Everything a refused request must leave alone, copied; call it on the server's loop.

    `with_accuracy=False` leaves out the evaluator's accuracy, for tests that let evaluations run:
    it lands from a background thread whenever one finishes."""
    acc = c.bsp.accumulator
    status = dataclasses.asdict(c.status())
    if not with_accuracy:
        status.pop("last_accuracy")
    return {
        "flat": c.store.flat.clone(),
        "optimizer": copy.deepcopy(c.store.optimizer_state()),
        "round": c.round,
        "version": c.version,
        "epoch": c.epoch,
        "samples": c.samples,
        "done": c.done,
        "reason": c.reason,
        "started": c.admission.started.is_set(),
        "controller": copy.deepcopy(c.policy.state_dict()),
        "accumulator": None if acc is None else (acc.weight, acc.count, acc.partial_sum()),
        "pushed": set(c.bsp.pushed),
        "active": {k: member_fields(m) for k, m in c.membership.active.items()},
        "pending": {k: member_fields(m) for k, m in c.membership.pending.items()},
        "departed": dict(c.membership.departed),
        "joined": c.membership._joined,
        "told_done": set(c.end.told_done),
        "status": status,
    }

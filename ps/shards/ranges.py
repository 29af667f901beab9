"""How the flat parameters split across shard servers (--shards), and how optimizer state follows.

Pure: no I/O. The split is contiguous and by value count, not by tensor: SGD (with momentum,
Nesterov, weight decay) and Adam act element by element, so stepping each range on its own shard
equals stepping the whole vector on one server.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

Range = tuple[int, int]


def split_ranges(numel: int, shards: int) -> list[Range]:
    """`shards` contiguous [start, stop) ranges covering 0..numel, sizes differing by at most one."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    if numel < shards:
        raise ValueError(f"cannot split {numel} values across {shards} shards")
    base, extra = divmod(numel, shards)
    ranges, start = [], 0
    for i in range(shards):
        stop = start + base + (1 if i < extra else 0)
        ranges.append((start, stop))
        start = stop
    return ranges


def slice_optimizer_state(state: dict[str, Any], numel: int, start: int, stop: int) -> dict[str, Any]:
    """The optimizer state of one range: every per-value tensor cut to [start, stop), the rest copied."""
    return {
        "state": {
            key: {name: _cut(value, numel, start, stop) for name, value in per_param.items()}
            for key, per_param in state["state"].items()
        },
        "param_groups": [dict(group) for group in state["param_groups"]],
    }


def merge_optimizer_states(states: Sequence[dict[str, Any]], ranges: Sequence[Range]) -> dict[str, Any]:
    """The inverse of slice_optimizer_state: per-value tensors concatenated in range order."""
    if len(states) != len(ranges) or not states:
        raise ValueError(f"{len(states)} optimizer states for {len(ranges)} ranges")
    first = states[0]
    merged: dict[Any, dict[str, Any]] = {}
    for key, per_param in first["state"].items():
        merged[key] = {}
        for name, value in per_param.items():
            if isinstance(value, torch.Tensor) and value.numel() == ranges[0][1] - ranges[0][0] and value.dim() == 1:
                merged[key][name] = torch.cat([s["state"][key][name] for s in states])
            else:  # a copy, as _cut makes: the merged state must not alias a live optimizer's step count
                merged[key][name] = value.clone() if isinstance(value, torch.Tensor) else value
    return {"state": merged, "param_groups": [dict(group) for group in first["param_groups"]]}


def _cut(value: Any, numel: int, start: int, stop: int) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() == 1 and value.numel() == numel:
        return value[start:stop].clone()
    return value.clone() if isinstance(value, torch.Tensor) else value

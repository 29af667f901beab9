"""The batch policy's settings (PolicyConfig, validated on construction) and the settings that differ
between two configs (what a resume with other flags changes). The policy names are the registry's
(ps/control/registry.py); the settings every policy shares are PolicyConfig's fields, those a policy
declares for itself (ps/control/settings.py) its `options`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ps.control.checks import integer, real
from ps.control.registry import POLICIES, policy_settings
from ps.control.settings import checked_options, setting_key

StartPolicy = Literal["uniform", "static"]
STARTS: tuple[str, ...] = ("uniform", "static")


@dataclass(frozen=True)
class PolicyConfig:
    """Settings of a batch policy (ps/control/policy.py); validated (and numbers normalised) on construction."""

    policy: str = "auto"
    """The batch policy's name (`--policy`): a key of ps.control.registry.POLICIES."""
    global_batch: int = 128
    deadband: float = 0.1
    min_batch: int = 1
    max_batch: int | None = None
    ewma_alpha: float = 0.3
    keep_global_sum: bool = True
    dynamic_start: StartPolicy = "uniform"
    min_samples: int = 3
    """Observations at a worker's current batch before the dynamic policy uses its time (moves it or
    counts it in t_bar): one noisy sample right after a batch change is no basis for a decision."""
    park: bool = True
    """The model and auto policies in BSP: plan a worker that cannot pay for itself at batch 0 (parked)
    when the predicted round is shorter without it. Ignored by the other policies and in ASP."""
    break_even: bool = False
    """With `park` (--adaptive-batch): also park an active worker whose plan puts it below its break-even
    batch, where its fixed cost exceeds its compute (ps/control/model/break_even.py)."""
    micro_batch: int = 1
    """BSP: every plan is in whole micro-batches of this many samples (ps/control/micro.py); 1: any batch."""
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """The policy's own settings by name, as its class declares them (`WorkerPlan.settings`); checked, and
    complete with the declared defaults, on construction (a checkpoint written before a setting existed
    reads back with its default)."""

    def __post_init__(self) -> None:
        """Reject settings the batch policy cannot honour, with a message saying what to change."""
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}; got {self.policy!r}")
        if self.dynamic_start not in STARTS:
            raise ValueError(f"dynamic_start must be one of {', '.join(STARTS)}; got {self.dynamic_start!r}")
        if not isinstance(self.keep_global_sum, bool):
            raise ValueError(f"keep_global_sum must be True (BSP) or False (ASP), got {self.keep_global_sum!r}")
        global_batch = integer("global_batch", self.global_batch, minimum=1)
        min_batch = integer("min_batch", self.min_batch, minimum=1)
        if min_batch > global_batch:
            raise ValueError(f"min_batch {min_batch} exceeds global_batch {global_batch}; lower min_batch")
        max_batch: int | None = None
        if self.max_batch is not None:
            max_batch = integer("max_batch", self.max_batch, minimum=1)
            if max_batch < min_batch:
                raise ValueError(f"max_batch {max_batch} is below min_batch {min_batch}; raise max_batch or use None")
        deadband = real("deadband", self.deadband)
        if not 0.0 <= deadband < 1.0:
            raise ValueError(f"deadband must be in [0, 1) (a fraction of the target batch), got {deadband}")
        alpha = real("ewma_alpha", self.ewma_alpha)
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"ewma_alpha must be in (0, 1] (1 = newest observation only), got {alpha}")
        min_samples = integer("min_samples", self.min_samples, minimum=1)
        micro_batch = integer("micro_batch", self.micro_batch, minimum=1)
        if micro_batch > 1:
            check_micro_batch(micro_batch, global_batch, min_batch, max_batch, self.keep_global_sum)
        if not isinstance(self.park, bool):
            raise ValueError(f"park must be True or False, got {self.park!r}")
        if not isinstance(self.break_even, bool):
            raise ValueError(f"break_even must be True or False, got {self.break_even!r}")
        options = checked_options(self.policy, policy_settings(self.policy), self.options)
        for name, value in (
            ("global_batch", global_batch),
            ("min_batch", min_batch),
            ("max_batch", max_batch),
            ("deadband", deadband),
            ("ewma_alpha", alpha),
            ("min_samples", min_samples),
            ("micro_batch", micro_batch),
            ("options", options),
        ):
            object.__setattr__(self, name, value)

    @property
    def default_max_batch(self) -> int:
        """Per-worker upper bound used when a worker declares none."""
        return self.global_batch if self.max_batch is None else self.max_batch


def check_micro_batch(micro_batch: int, global_batch: int, min_batch: int, max_batch: int | None,
                      keep_global_sum: bool) -> None:
    """Reject a micro-batch the plan cannot be made of: B not a whole number of micro-batches, a
    max_batch below one micro-batch, or ASP (whose updates have no common sum to keep)."""
    if not keep_global_sum:
        raise ValueError(f"micro_batch {micro_batch} is for BSP: ASP updates do not add up to one global batch")
    if global_batch % micro_batch:
        raise ValueError(f"global_batch {global_batch} is not a multiple of micro_batch {micro_batch}; "
                         f"use a global batch of {nearest_multiples(global_batch, micro_batch)}")
    if max_batch is not None and max_batch < micro_batch:
        raise ValueError(f"max_batch {max_batch} is below micro_batch {micro_batch}: no worker could take one micro-batch")


def nearest_multiples(total: int, micro_batch: int) -> str:
    """The multiples of `micro_batch` nearest `total` (not a multiple of it), below and above, as a
    remedy reads them: "96 or 128", or the one above where none is below ("32" for 20 with 32)."""
    below = total // micro_batch * micro_batch
    above = below + micro_batch
    return f"{below} or {above}" if below else str(above)


def config_changes(before: PolicyConfig, after: PolicyConfig) -> dict[str, tuple[Any, Any]]:
    """The settings that differ between two configs: {field: (before, after)}, in field order, then a
    policy's own as {"<policy>.<setting>": (before, after)} (None: the config's policy has no such setting)."""
    old, new = asdict(before), asdict(after)
    old_options, new_options = old.pop("options"), new.pop("options")
    changes = {name: (old[name], value) for name, value in new.items() if old[name] != value}
    own = {setting_key(before.policy, k): (v, None) for k, v in old_options.items()}
    for k, v in new_options.items():
        key = setting_key(after.policy, k)
        own[key] = (own.get(key, (None, None))[0], v)
    return {**changes, **{key: pair for key, pair in own.items() if pair[0] != pair[1]}}

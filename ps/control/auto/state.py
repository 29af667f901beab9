"""The auto policy's own part of its checkpoint state: each worker's observations, settled mark,
admitted batch, whether its change was found on one time alone and the shape of its law before that
change (worker_laws.py), who changed speed since the last decision, the slowest time per sample
measured, the parking schedule, the rounds behind c and the plan's measured round, and whether a
decision is asked for or a re-solve awaits its confirmation; written as plain data and read back with
every value checked, so a state that contradicts itself is refused with the field it names (pure). A
resumed worker's first steps are warm-up again, as after a join."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ps.control.model.parking import ParkingSchedule
from ps.control.model.rounds import RoundLog
from ps.control.auto.worker_laws import WorkerLaws
from ps.control.checks import integer, positive
from ps.control.model.state import nonnegative, observations
from ps.control.model.observations import Observations

WORKER_KEYS = frozenset({"obs", "seq", "settled", "admitted", "lone", "shape"})
KEYS = frozenset({"workers", "changed", "parking", "overhead", "measured", "predicted", "follow_up", "confirming"})
OPTIONAL_KEYS = frozenset({"slowest"})
"""Keys a state may lack (a state written without them reads as none measured)."""


@dataclass
class AutoPart:
    """What the auto policy holds beside its laws, read back."""

    parking: ParkingSchedule
    rounds: RoundLog
    follow_up: bool
    confirming: bool


def auto_part(laws: WorkerLaws, parking: ParkingSchedule, rounds: RoundLog, follow_up: bool,
              confirming: bool) -> dict[str, Any]:
    """The auto policy's state as plain data."""
    return {
        "workers": {k: {"obs": [list(item) for item in o.items], "seq": o.seq, "settled": laws.settled[k],
                        **({"admitted": laws.admitted[k]} if k in laws.admitted else {}),
                        **({"lone": True} if k in laws.lone else {}),
                        **({"shape": laws.shapes[k]} if k in laws.shapes else {})}
                    for k, o in laws.obs.items()},
        "changed": sorted(laws.changed), "slowest": laws.slowest, "parking": parking.state(),
        "overhead": list(rounds.overhead), "measured": list(rounds.measured), "predicted": rounds.predicted,
        "follow_up": follow_up, "confirming": confirming,
    }


def adopted_part(part: dict[str, Any], plan: Mapping[str, int]) -> dict[str, Any]:
    """Another auto policy's part (`auto_part`) as the policy that takes over its workers keeps it: its
    parking, and a recall's forgiving, only of the workers `plan` keeps at 0."""
    parking = part["parking"]
    parked = {k: v for k, v in parking["parked"].items() if plan.get(k) == 0}
    forgiven = [k for k in parking["forgiven"] if k in parked or k in parking["reprobed"]]
    return {**part, "parking": {**parking, "parked": parked, "forgiven": forgiven}}


def read_auto_part(raw: Any, plan: Mapping[str, int], laws: WorkerLaws) -> AutoPart:
    """`raw` read back into `laws` (of the policy's workers, whose plan is `plan`) and the rest;
    ValueError on a malformed state, or one whose parked workers are not those at batch 0."""
    if not isinstance(raw, Mapping) or not KEYS <= set(raw) <= KEYS | OPTIONAL_KEYS:
        raise ValueError(f"auto policy state must have the keys {sorted(KEYS)} (and may have {sorted(OPTIONAL_KEYS)})")
    workers = list(laws.obs)
    entries = raw["workers"]
    if not isinstance(entries, Mapping) or set(entries) != set(workers):
        raise ValueError("auto policy state must have one entry per worker of the policy")
    for k, entry in entries.items():
        if not isinstance(entry, Mapping) or not {"obs", "seq", "settled"} <= set(entry) <= WORKER_KEYS:
            raise ValueError(f"auto state of {k!r} must have the keys obs, seq, settled (and may have admitted, lone, shape)")
        laws.obs[k] = Observations(observations(k, entry["obs"]), integer(f"seq of {k!r}", entry["seq"], minimum=0))
        laws.settled[k] = integer(f"settled mark of {k!r}", entry["settled"], minimum=0)
        laws.admitted.pop(k, None)
        laws.lone.discard(k)
        laws.shapes.pop(k, None)
        if "shape" in entry:
            laws.shapes[k] = positive(f"auto state 'shape' of {k!r}", entry["shape"])
        if "admitted" in entry:
            laws.admitted[k] = integer(f"admitted batch of {k!r}", entry["admitted"], minimum=1)
        if "lone" in entry:
            if entry["lone"] is not True or "admitted" not in entry:
                raise ValueError(f"auto state 'lone' of {k!r} must be true, beside an admitted batch")
            laws.lone.add(k)
    laws.revision += 1
    changed = raw["changed"]
    if not isinstance(changed, list) or not set(changed) <= set(workers):
        raise ValueError("auto state 'changed' must list workers of the policy")
    laws.changed = set(changed)
    slowest = raw.get("slowest")
    laws.slowest = None if slowest is None else nonnegative("slowest", slowest)
    parking = ParkingSchedule.from_state(raw["parking"], workers)
    zero = {k for k, b in plan.items() if b == 0}
    if set(parking.parked) != zero:
        raise ValueError(f"the parked workers {sorted(parking.parked)} are not those at batch 0 ({sorted(zero)})")
    for flag in ("follow_up", "confirming"):
        if not isinstance(raw[flag], bool):
            raise ValueError(f"auto state {flag!r} must be true or false")
    rounds = RoundLog([nonnegative("overhead", v) for v in _list("overhead", raw["overhead"])],
                      [nonnegative("measured", v) for v in _list("measured", raw["measured"])],
                      None if raw["predicted"] is None else nonnegative("predicted", raw["predicted"]))
    return AutoPart(parking, rounds, raw["follow_up"], raw["confirming"])


def _list(name: str, value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"auto state {name!r} must be a list")
    return value

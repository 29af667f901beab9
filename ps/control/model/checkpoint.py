"""The model policy's own part of its checkpoint state: each worker's observations, probe count and
parking, who is a probe not yet measured or back for a re-probe, the rounds behind c and the plan's
measured round, and where the decisions stand (solved, a re-solve awaiting its confirmation, the
observations since the last one); written as plain data and read back with every value checked
(state.py), so a state that contradicts itself is refused with the field it names. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ps.control.checks import integer
from ps.control.model.parking import Parked, ParkingSchedule
from ps.control.model.rounds import WorkerSetRounds
from ps.control.model.state import flag, model_part, nonnegative, observations, parking_entry, state_list
from ps.control.model.observations import Observations
from ps.control.model.worker_fits import WorkerFits


@dataclass
class ModelPart:
    """What the model policy holds beside its fits, read back."""

    parking: ParkingSchedule
    probing: set[str]
    rounds: WorkerSetRounds
    solved: bool
    confirming: bool
    since_decision: int


def model_state(fits: WorkerFits, part: ModelPart) -> dict[str, Any]:
    """The model policy's state as plain data."""
    parked = part.parking.parked
    return {
        "workers": {
            k: {"obs": [list(item) for item in o.items], "seq": o.seq, "probes": fits.probes[k],
                "parked": None if k not in parked else [parked[k].waited, parked[k].every, parked[k].until_ms]}
            for k, o in fits.obs.items()
        },
        "probing": sorted(part.probing), "reprobed": dict(part.parking.reprobed),
        "overhead": list(part.rounds.overhead), "measured": list(part.rounds.measured),
        "predicted": part.rounds.predicted, "solved": part.solved, "confirming": part.confirming,
        "since_decision": part.since_decision, "parking_clock_ms": part.parking.clock_ms,
    }


def read_model_state(raw: Any, plan: Mapping[str, int], fits: WorkerFits) -> ModelPart:
    """`raw` read back into `fits` (of the policy's workers, whose plan is `plan`) and the rest;
    ValueError on a malformed state, or one whose parked workers are not those at batch 0."""
    raw = model_part(raw)
    workers = raw["workers"]
    if not isinstance(workers, Mapping) or set(workers) != set(fits.obs):
        raise ValueError("model policy state must have one entry per worker of the policy")
    parking = ParkingSchedule()
    for k, entry in workers.items():
        if not isinstance(entry, Mapping) or set(entry) != {"obs", "seq", "probes", "parked"}:
            raise ValueError(f"model state of {k!r} must have the keys obs, seq, probes, parked")
        fits.obs[k] = Observations(observations(k, entry["obs"]), integer(f"seq of {k!r}", entry["seq"], minimum=0))
        fits.probes[k] = integer(f"probes of {k!r}", entry["probes"], minimum=0)
        if entry["parked"] is not None:
            waited, every, until_ms = parking_entry(k, entry["parked"])
            if plan.get(k) != 0:
                raise ValueError(f"worker {k!r} is parked in the model state but has batch {plan.get(k)}")
            parking.parked[k] = Parked(waited, every, until_ms)
        elif plan.get(k) == 0:
            raise ValueError(f"worker {k!r} has batch 0 but is not parked in the model state")
    probing = raw["probing"]
    if not isinstance(probing, list) or not set(probing) <= set(fits.obs):
        raise ValueError("model state 'probing' must list workers of the policy")
    reprobed = raw["reprobed"]
    if not isinstance(reprobed, Mapping) or not set(reprobed) <= set(fits.obs):
        raise ValueError("model state 'reprobed' must map workers of the policy to their wait")
    parking.reprobed = {k: integer(f"re-probe wait of {k!r}", v, minimum=1) for k, v in reprobed.items()}
    parking.clock_ms = nonnegative("parking_clock_ms", raw.get("parking_clock_ms", 0.0))
    rounds = WorkerSetRounds([nonnegative("overhead", v) for v in state_list("overhead", raw["overhead"])],
                             [nonnegative("measured", v) for v in state_list("measured", raw["measured"])],
                             None if raw["predicted"] is None else nonnegative("predicted", raw["predicted"]))
    return ModelPart(parking, set(probing), rounds, flag("solved", raw["solved"]),
                     flag("confirming", raw.get("confirming", False)),
                     integer("since_decision", raw["since_decision"], minimum=0))

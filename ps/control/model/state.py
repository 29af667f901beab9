"""The checks that read the model and auto policies' checkpoint state back: each value checked as it
is read, so a state file that contradicts itself or holds garbage is refused with the field it names
(the model's part itself: checkpoint.py). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ps.control.checks import integer, real

MODEL_KEYS = frozenset({"workers", "probing", "reprobed", "overhead", "measured", "predicted", "solved",
                        "since_decision"})
OPTIONAL_KEYS = frozenset({"confirming", "parking_clock_ms"})
"""Keys a state may lack: one written before they existed loads with their defaults."""


def model_part(value: Any) -> Mapping[str, Any]:
    """The state's model part, if it has every key MODEL_KEYS names and none but OPTIONAL_KEYS beside."""
    if not isinstance(value, Mapping) or not MODEL_KEYS <= set(value) <= MODEL_KEYS | OPTIONAL_KEYS:
        raise ValueError(f"model policy state must have the keys {sorted(MODEL_KEYS)} "
                         f"(and may have {sorted(OPTIONAL_KEYS)})")
    return value


def flag(name: str, value: Any) -> bool:
    """`value` if it is true or false."""
    if not isinstance(value, bool):
        raise ValueError(f"model state {name!r} must be true or false")
    return value


def state_list(name: str, value: Any) -> list[Any]:
    """`value` if it is a list."""
    if not isinstance(value, list):
        raise ValueError(f"model state {name!r} must be a list")
    return value


def nonnegative(name: str, value: Any) -> float:
    """`value` as a finite float >= 0."""
    number = real(name, value)
    if number < 0:
        raise ValueError(f"{name} must be >= 0, got {number}")
    return number


def parking_entry(worker_id: str, value: Any) -> tuple[int, int, float]:
    """A parked worker's [decisions waited, decisions between re-probes, the parking clock's ms it
    waits for] (a state without the third waits for none)."""
    if not isinstance(value, list) or len(value) not in (2, 3):
        raise ValueError(f"parking of {worker_id!r} must be [waited, every, until ms]")
    until = nonnegative(f"parking clock of {worker_id!r}", value[2]) if len(value) == 3 else 0.0
    return (integer(f"parking wait of {worker_id!r}", value[0], minimum=0),
            integer(f"re-probe interval of {worker_id!r}", value[1], minimum=1), until)


def observations(worker_id: str, value: Any) -> list[tuple[int, int, float, float | None]]:
    """A worker's saved observations: [sequence number, batch, ms, exposed ms or null], no number twice."""
    items = []
    for item in state_list(f"obs of {worker_id}", value):
        if not isinstance(item, list) or len(item) != 4:
            raise ValueError(f"each observation of {worker_id!r} must be [seq, batch, ms, exposed ms or null]")
        seq = integer(f"observation number of {worker_id!r}", item[0], minimum=0)
        batch = integer(f"observed batch of {worker_id!r}", item[1], minimum=1)
        ms = nonnegative(f"observed ms of {worker_id!r}", item[2])
        exposed = None if item[3] is None else nonnegative(f"observed exposed ms of {worker_id!r}", item[3])
        items.append((seq, batch, ms, exposed))
    if len({seq for seq, *_ in items}) != len(items):
        raise ValueError(f"the observations of {worker_id!r} repeat a sequence number")
    return items

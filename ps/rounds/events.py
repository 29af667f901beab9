"""The round events the concerns of ps/rounds hear of, each a list of listeners called in the order they
subscribed: a concern that must react to another's change subscribes to its event, instead of the
coordinator reaching into it (or one concern writing another's fields)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, ParamSpec

from ps.rounds.membership import Member

P = ParamSpec("P")


class Event(Generic[P]):
    """One kind of event: its listeners, in the order they subscribed."""

    def __init__(self) -> None:
        self._listeners: list[Callable[P, None]] = []

    def subscribe(self, listener: Callable[P, None]) -> None:
        self._listeners.append(listener)

    def emit(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Call every listener; one that raises stops the others (they are the same step's parts)."""
        for listener in list(self._listeners):
            listener(*args, **kwargs)


class RoundEvents:
    """The job's events."""

    def __init__(self) -> None:
        self.plan_changed: Event[[]] = Event()
        """A new plan: workers came, a resume started from the checkpoint's, --adaptive-batch moved B."""
        self.member_removed: Event[[Member]] = Event()
        """A member left or was evicted (before the plan is split again without it)."""
        self.ended: Event[[str]] = Event()
        """The job is done (finished or stopped), for the reason given."""

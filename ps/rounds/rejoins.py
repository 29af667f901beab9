"""What a worker name's earlier joins in this job earn its next one. Pure: the clock is passed in.

- **The warm-up bound, once per name.** A member's first round may take the warm-up's bound
  (ps.rounds.deadlines: its first pull, its warm-up) only the first time its name enters the job; the
  same name back after an eviction or a leave is held to the round's deadline like everyone, so a
  worker that never pushes and rejoins each time it is evicted does not hold every round for the
  warm-up's bound.
- **Probation until a push.** A member that enters a running BSP job under a name that has had no
  push taken in this job proves it computes before the plan holds it (ps.rounds.probation); `proved`
  notes the push, `proven` tells.
- **Rejoins that make no progress back off.** A member that leaves or is evicted without having pushed
  since it joined is a strike against its name; the name may join again only `backoff_s` after
  that departure, doubling with each strike in a row up to `max_backoff_s` (RESOURCE_EXHAUSTED, which
  says when). A departure after a push clears the strikes: a worker evicted in a partition comes back
  at once.

The record keeps `max_names` names (the least recently seen go first)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace

from common.errors import ResourceExhausted

BACKOFF_S = 1.0
"""The wait after a name's first departure without a push."""
MAX_BACKOFF_S = 60.0
"""The longest wait, however many departures without a push came in a row."""
MAX_NAMES = 10_000


@dataclass(frozen=True)
class NameRecord:
    warmed: bool = False  # a member of this name has entered the job (its first round had the warm-up bound)
    strikes: int = 0  # departures in a row without a push
    not_before: float = 0.0  # when the name may join again
    proven: bool = False  # a push of this name was taken in this job (a probe's or a round's)


class Rejoins:
    """The names that joined this job: whether each had its warm-up, and when it may join again."""

    def __init__(self, backoff_s: float = BACKOFF_S, max_backoff_s: float = MAX_BACKOFF_S,
                 max_names: int = MAX_NAMES) -> None:
        if not 0 < backoff_s <= max_backoff_s:
            raise ValueError(f"the rejoin backoff must be in (0, {max_backoff_s}] seconds, got {backoff_s}")
        self.backoff_s, self.max_backoff_s, self.max_names = backoff_s, max_backoff_s, max_names
        self._names: OrderedDict[str, NameRecord] = OrderedDict()
        self.refused = 0  # joins refused for their name's backoff

    def _keep(self, name: str, record: NameRecord) -> None:
        """`name`'s record, as the most recently seen."""
        self._names.pop(name, None)
        self._names[name] = record
        while len(self._names) > self.max_names:
            self._names.popitem(last=False)

    def check(self, name: str, now: float) -> None:
        """ResourceExhausted while `name` is backing off, saying when it may join again."""
        record = self._names.get(name)
        if record is None or now >= record.not_before:
            return
        self.refused += 1
        raise ResourceExhausted(
            f"worker name {name!r} left or was evicted {record.strikes} time(s) in a row without a push: join again "
            f"in {record.not_before - now:.1f} s (the wait doubles with each such departure, from {self.backoff_s:g} "
            f"up to {self.max_backoff_s:g} s; a push clears it)")

    def entered(self, name: str) -> bool:
        """A member named `name` enters the job: whether its first round has the warm-up bound (the
        name's first entry)."""
        record = self._names.get(name, NameRecord())
        self._keep(name, replace(record, warmed=True))
        return not record.warmed

    def proved(self, name: str) -> None:
        """A push of a member named `name` was taken (a probe, or one a round counted)."""
        record = self._names.get(name, NameRecord())
        if not record.proven:
            self._keep(name, replace(record, proven=True))

    def proven(self, name: str) -> bool:
        """Whether a push of this name was taken in this job."""
        record = self._names.get(name)
        return record is not None and record.proven

    def departed(self, name: str, pushed: bool, now: float) -> float:
        """A member named `name` left or was evicted (`pushed`: it pushed since it joined); the seconds
        before the name may join again."""
        record = self._names.get(name, NameRecord())
        if pushed:
            self._keep(name, replace(record, strikes=0, not_before=now, proven=True))
            return 0.0
        strikes = record.strikes + 1
        wait = min(self.max_backoff_s, self.backoff_s * 2.0 ** (strikes - 1))
        self._keep(name, replace(record, strikes=strikes, not_before=now + wait))
        return wait

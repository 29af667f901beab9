"""ASP updates: a push names the parameter version its update was computed from, at most
--max-staleness versions old; the update is applied at once (θ ← θ + Δ), one version more, and the
worker's staleness is counted."""

from __future__ import annotations

from ps.errors import FailedPrecondition
from ps.rounds.membership import Member
from ps.rounds.state import JobState
from ps.transport.chunked import Vector
from ps.transport.magnitude import magnitude_of
from ps.transport.messages import PushMeta


class AspUpdates:
    """The staleness bound and the update rule."""

    def __init__(self, state: JobState, max_staleness: int | None) -> None:
        self.state = state
        self.max_staleness = max_staleness

    def check_version(self, meta: PushMeta) -> None:
        """The push's version is one the server has had, and not too old."""
        version = self.state.version
        if meta.version > version or meta.version < 0:
            raise FailedPrecondition(f"version {meta.version} is unknown; the current version is {version}")
        if self.max_staleness is not None and version - meta.version > self.max_staleness:
            raise FailedPrecondition(
                f"version {meta.version} is {version - meta.version} versions old, over the limit "
                f"{self.max_staleness}; pull and recompute"
            )

    def apply(self, member: Member, meta: PushMeta, delta: Vector) -> None:
        """θ ← θ + Δ (checked by the push checks: it cannot refuse now); the controller observes the
        worker's time; one version more."""
        s = self.state
        s.store.apply_update(delta, magnitude_of(delta))
        s.controller.observe(member.name, meta.batch_size, meta.compute_ms)
        member.staleness_sum += s.version - meta.version
        s.version += 1

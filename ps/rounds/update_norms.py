"""Robust aggregation on the server (ps-server --max-update-norm, --clip-outliers): every push of values,
a BSP gradient or an ASP update, is measured and clipped to the limit in force before the push checks
and the aggregation see it (the rule: common.params.norm_clip). Each clipped push is a
`update_clipped` event (worker, norm, limit); the summary counts them. Off, nothing is measured."""

from __future__ import annotations

from typing import Any

from common.params.norm_clip import NormClip, NormLimits, scaled, vector_norm
from common.transport.chunked import Vector
from ps.rounds.membership import Member
from ps.rounds.state import JobState


class UpdateNorms:
    """The clip of the pushes' norms, with what it did."""

    def __init__(self, state: JobState, limits: NormLimits) -> None:
        self.state = state
        self.clip = NormClip(limits)
        self.clipped = 0  # pushes clipped so far

    def bound(self, member: Member, values: Vector) -> Vector:
        """`values`, or a copy scaled down to the limit in force where their norm exceeds it."""
        if not self.clip.limits.on:
            return values
        norm = vector_norm(values)
        limit = self.clip.limit()
        factor = self.clip.factor(norm)
        if factor == 1.0:
            return values
        assert limit is not None  # a factor below 1 comes from a limit
        self.clipped += 1
        s = self.state
        s.metrics.write("update_clipped", worker=member.name, norm=float(f"{norm:.4g}"), limit=float(f"{limit:.4g}"),
                        step=s.step, epoch=s.epoch)
        return scaled(values, factor)

    def report(self) -> dict[str, Any]:
        """The summary's count of clipped pushes (nothing when both rules are off)."""
        return {"clipped_updates": self.clipped} if self.clip.limits.on else {}

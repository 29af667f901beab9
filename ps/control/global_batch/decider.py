"""The adaptive batch's state across decisions (`--adaptive-batch gns`): B now, the goodput move or
probe under review until its rounds are measured (taken back where they contradict it, goodput.py's
`contradicted`), the directions closed by take-backs, the learning-rate factor of B now, and the
checkpoint of all of it. Each decision itself is goodput.py's. Pure: no clock, no I/O."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from common.number_checks import finite, whole
from ps.control.global_batch.gns import statistical_efficiency
from ps.control.global_batch.goodput import (PROBE, UNMEASURABLE, AdaptiveConfig, Decision, choose, contradicted,
                                             lr_factor, measured_goodput, moved)

STATE_FORMAT = "adaptive-batch/2"
"""Written by `AdaptiveBatch.state_dict`; "adaptive-batch/1" (without the move under review and the
closed directions) still loads, with neither, and a /2 state without "probing" as a goodput move's."""
TAKE_BACK_MEMORY = 8
"""Decisions a direction stays closed after a move in it was taken back."""
PROBE_BACK = "taken back: the probe measured no more goodput"
"""The reason of the return from a probe whose measured goodput was not higher."""
REOPEN_FACTOR = 2.0
"""A direction closed by a take-back opens again once φ is this many times higher or lower than the
φ the take-back was judged at. Both batches were priced at that φ, and while training starts φ
falls tenfold or more within a few decisions: a probe down judged at φ ≫ B finds every batch as
efficient, so the smaller one loses on throughput alone, and the way down stayed closed for
TAKE_BACK_MEMORY decisions (40 s of a run to 0.8 that took 87) after φ had come down to B's size."""


class AdaptiveBatch:
    """The decision's state: B now, φ at the last decision, the decisions taken and their changes, the
    goodput move or probe under review (`previous`: the B it left, until the move is measured;
    `probing`: the move is a probe) and the directions closed by take-backs (`closed`: "up"/"down" ->
    [the batch B may not pass, decisions left]; `closed_phi`: the φ a take-back was judged at, by
    direction, for those REOPEN_FACTOR opens again)."""

    def __init__(self, config: AdaptiveConfig) -> None:
        self.config = config
        self.batch = config.base_batch
        self.phi: float | None = None
        self.decisions = 0
        self.changes = 0
        self.last: Decision | None = None
        self.previous: int | None = None
        self.probing = False
        self.closed: dict[str, list[int]] = {}
        self.closed_phi: dict[str, float] = {}

    def bounds(self, lower: int, upper: int, phi: float | None = None) -> tuple[int, int]:
        """[lower, upper] narrowed by the closed directions (those closed at a φ that `phi`, φ now, is
        REOPEN_FACTOR from are opened first)."""
        if phi is not None:
            self._reopen(phi)
        if "up" in self.closed:
            upper = min(upper, self.closed["up"][0])
        if "down" in self.closed:
            lower = max(lower, self.closed["down"][0])
        return lower, upper

    def choose(self, phi: float | None, lower: int, upper: int, round_ms: Callable[[int], float] | None,
               upward_only: bool = False, phi_sd: float | None = None,
               measurable: Callable[[int], bool] | None = None) -> Decision:
        """One decision at the current batch within the bounds left open (counted; φ kept for the LR
        rule); `apply` it once the caller has re-split the new B."""
        lo, hi = self.bounds(lower, upper, phi)
        return self.note(choose(self.config, self.batch, phi, lo, hi, round_ms, upward_only, phi_sd, measurable))

    def review(self, phi: float | None, rounds: Mapping[int, float], noise: Mapping[int, float],
               round_ms: Callable[[int], float] | None = None) -> Decision | None:
        """The goodput move or probe under review, if any: a decision to wait while the batch moved to
        is not measured yet (`rounds`: the median round measured at each B, `noise` its relative
        standard error), a take-back to the batch before where the measured goodput contradicts the
        move (`contradicted`) or, for a probe, where it is not higher than before (a probe is a
        measurement, made on no predicted gain: B stays there only on a measured one); the direction
        taken back is then closed for TAKE_BACK_MEMORY decisions. Else None (the move stands and is
        no longer under review)."""
        previous, current = self.previous, self.batch
        if previous is None or phi is None:
            return None
        if current not in rounds:
            return self.note(moved(self.config, current, current, phi, "measuring the batch moved to", round_ms))
        probing, self.previous, self.probing = self.probing, None, False
        base = self.config.base_batch
        if probing:
            back = (previous in rounds and measured_goodput(current, rounds[current], phi, base)
                    <= measured_goodput(previous, rounds[previous], phi, base))
        else:
            back = contradicted(previous, current, rounds, phi, base, noise)
        if not back:
            return None
        direction = "up" if previous < current else "down"
        self.closed[direction], self.closed_phi[direction] = [previous, TAKE_BACK_MEMORY + 1], phi
        return self.note(moved(self.config, current, previous, phi, PROBE_BACK if probing else "taken back: measured goodput fell"))

    def note(self, decision: Decision) -> Decision:
        """Count a decision made at the current batch (by `choose`, or a probe or take-back: `moved`);
        a closed direction opens again after its decisions."""
        self.phi = decision.phi if decision.phi is not None else self.phi
        self.decisions += 1
        self.last = decision
        for direction, entry in list(self.closed.items()):
            entry[1] -= 1
            if entry[1] <= 0:
                del self.closed[direction]
                self.closed_phi.pop(direction, None)
        return decision

    def _reopen(self, phi: float) -> None:
        """Open the directions whose take-back was judged at a φ REOPEN_FACTOR or more from `phi`."""
        for direction, judged in list(self.closed_phi.items()):
            if phi > REOPEN_FACTOR * judged or judged > REOPEN_FACTOR * phi:
                self.closed.pop(direction, None)
                del self.closed_phi[direction]

    def apply(self, decision: Decision) -> None:
        """The decision's batch is now B; a goodput move is under review until measured. A move away
        from a B where φ was not measurable closes the way back for TAKE_BACK_MEMORY decisions: the
        plan a goodput move would install there can differ from the one its check predicted (on HL8
        B went 83 -> 77 -> 83 three times, each 77 run on one worker)."""
        if decision.changed and decision.batch != self.batch:
            if decision.reason == UNMEASURABLE:
                direction = "down" if decision.batch > self.batch else "up"
                self.closed[direction] = [decision.batch, TAKE_BACK_MEMORY]
                self.closed_phi.pop(direction, None)  # closed on the plan, not on φ
            self.previous = self.batch if decision.reason in ("goodput", PROBE) else None
            self.probing = decision.reason == PROBE
            self.batch = decision.batch
            self.changes += 1

    def lr_factor(self) -> float:
        """The factor on the job's learning rate at the current batch."""
        return lr_factor(self.config.lr_scaling, self.batch, self.config.base_batch, self.phi)

    def efficiency(self) -> float | None:
        """E(B) of the current batch (None while φ is unknown)."""
        return None if self.phi is None else statistical_efficiency(self.phi, self.batch, self.config.base_batch)

    def state_dict(self) -> dict[str, Any]:
        return {"format": STATE_FORMAT, "base_batch": self.config.base_batch, "batch": self.batch, "phi": self.phi,
                "decisions": self.decisions, "changes": self.changes, "previous": self.previous,
                "probing": self.probing, "closed": {k: list(v) for k, v in self.closed.items()},
                "closed_phi": dict(self.closed_phi)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take a checkpoint's state, STATE_FORMAT or "adaptive-batch/1" (ValueError, nothing changed,
        on a malformed one, another B₀ or a B outside the job's bounds)."""
        if not isinstance(state, Mapping) or state.get("format") not in (STATE_FORMAT, "adaptive-batch/1"):
            raise ValueError(f"adaptive-batch state must be a mapping of format {STATE_FORMAT!r} "
                             "(or 'adaptive-batch/1')")
        if state.get("base_batch") != self.config.base_batch:
            raise ValueError(f"the checkpoint started at --global-batch {state.get('base_batch')!r}, "
                             f"not {self.config.base_batch}")
        batch = whole("adaptive batch", state.get("batch"), 1)
        lo, hi = self.config.min_batch, self.config.max_batch
        if not lo <= batch <= hi:  # below: workers refused as the job full; above: more than the flags allow
            raise ValueError(f"the checkpoint's adaptive batch B = {batch} is outside [--min-global-batch {lo}, "
                             f"--max-global-batch {hi}]")
        phi = state.get("phi")
        phi = None if phi is None else finite("phi", phi, 0.0)
        decisions = whole("decisions", state.get("decisions"), 0)
        changes = whole("changes", state.get("changes"), 0)
        previous, closed, probing, closed_phi = None, {}, False, {}
        if state["format"] == STATE_FORMAT:
            previous = None if state.get("previous") is None else whole("previous batch", state.get("previous"), 1)
            closed = _closed(state.get("closed"))
            closed_phi = _closed_phi(state.get("closed_phi", {}), closed)
            probing = state.get("probing", False)
            if not isinstance(probing, bool):
                raise ValueError(f"adaptive-batch state 'probing' must be true or false, got {probing!r}")
        self.batch, self.phi, self.decisions, self.changes = batch, phi, decisions, changes
        self.previous, self.closed, self.probing = previous, closed, probing and previous is not None
        self.closed_phi = closed_phi


def _closed(value: Any) -> dict[str, list[int]]:
    """The state's closed directions, checked."""
    if not isinstance(value, Mapping) or not set(value) <= {"up", "down"}:
        raise ValueError("adaptive-batch state 'closed' must map 'up'/'down' to [batch, decisions left]")
    out = {}
    for direction, entry in value.items():
        if not isinstance(entry, (list, tuple)) or len(entry) != 2:
            raise ValueError(f"adaptive-batch state 'closed' {direction!r} must be [batch, decisions left]")
        out[direction] = [whole(f"closed {direction} batch", entry[0], 1), whole(f"closed {direction} decisions", entry[1], 1)]
    return out


def _closed_phi(value: Any, closed: Mapping[str, list[int]]) -> dict[str, float]:
    """The state's φ of each closed direction's take-back (optional: a state without it reopens them
    only by count), checked."""
    if not isinstance(value, Mapping) or not set(value) <= set(closed):
        raise ValueError("adaptive-batch state 'closed_phi' must map closed directions to the φ they were closed at")
    return {direction: finite(f"closed_phi {direction}", phi, 0.0) for direction, phi in value.items()}

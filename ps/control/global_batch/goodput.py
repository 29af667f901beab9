"""`--adaptive-batch gns`: the global batch B that maximises goodput, and the learning rate at it.

Goodput (Pollux, Cannikin §4) is progress per second: throughput(B), samples per second as the one
model of a round predicts a round of B (ps/control/performance.py), times the statistical efficiency E(B) = (φ + B₀)/(φ + B), the progress a
sample at batch B makes relative to one at the starting batch B₀ (φ the gradient noise scale,
ps/control/global_batch/gns.py). A larger B is faster per sample where a round has fixed costs, and worth less
per sample once B passes φ. `choose` scans B in [lower, upper] and moves only when the best predicted
goodput beats the current one by the threshold (a change costs re-measuring every worker) and by
what the noise scale's uncertainty could explain (the gain at φ ± its standard error). A goodput move
is measured at the batch it went to and taken back where the measured goodput fell by more than the
rounds' noise; that direction is then closed for TAKE_BACK_MEMORY decisions (`AdaptiveBatch.review`).

The learning rate follows B by one of three rules (`lr_factor`, a factor on the job's schedule):
linear B/B₀ (Goyal et al.), sqrt √(B/B₀) (Krizhevsky), and adascale, AdaScale's gain ratio
r = (B/B₀)·E(B): the LR grows linearly while noise dominates (B ≪ φ) and stops growing once the
signal does (B ≫ φ), the same progress per sample the efficiency counts. Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from ps.control.global_batch.gns import statistical_efficiency
from common.number_checks import finite, whole

LR_SCALINGS: tuple[str, ...] = ("adascale", "linear", "sqrt")
"""The `--lr-scaling` rules (the first is the default)."""
STATE_FORMAT = "adaptive-batch/2"
"""Written by `AdaptiveBatch.state_dict`; "adaptive-batch/1" (without the move under review and the
closed directions) still loads, with neither."""
TAKE_BACK_MEMORY = 8
"""Decisions a direction stays closed after a move in it was taken back."""
NOISE_SDS = 2.0
"""A measured goodput contradicts a move only where it fell by more than this many standard errors
of the two median rounds it compares."""
GAIN_SDS = 2.0
"""A goodput move needs a predicted gain beyond what φ this many standard errors either way could
explain: a decision every few rounds is many chances for a one-error spread to pass (on HL8 φ read 235
sixteen rounds into a job and 7 eight rounds later, and a move made on the first was taken back)."""
SETTLE_ROUNDS, MIN_ROUNDS = 2, 6
"""Rounds after a change of B left out of its median round (the workers settle at new batches), and how
many a stay at B needs before that median counts as the round at that B (on digits at B=179 an epoch
holds 8)."""
DECIDE_EVERY = SETTLE_ROUNDS + MIN_ROUNDS
"""The default `--adapt-every`, in rounds: a decision as soon as the round at B can be measured. A
decision at each epoch's end (`--adapt-every epoch`) leaves the whole first epoch at B₀, and from a start
far from the best B that epoch is most of the time to a target accuracy."""
OUTSIDE = "outside the bounds"
"""The reason of a move into the range a decision chooses from, from a B outside it (`choose`; the
server moves a B₀ an epoch cannot hold enough rounds of at its first round)."""
UNMEASURABLE = "the noise scale is not measurable at the current batch"
"""The reason of a move away from a B whose plan trains one worker (`choose`)."""
_GRID = 48
"""Candidate batches per decision: a geometric grid over [lower, upper] (plus both ends and B now)."""
MIN_STEPS_PER_EPOCH = 8
"""A candidate B leaves at least this many rounds in an epoch (`epoch_bound`): a B near the training
set's size makes one or two steps an epoch, too few for the model to learn from or for a round time
to be measured at it (digits' 1,437 training samples bound B at 179)."""


@dataclass(frozen=True)
class AdaptiveConfig:
    """The settings of `--adaptive-batch gns`, validated on construction (ValueError naming the flag)."""

    base_batch: int
    min_batch: int
    max_batch: int
    threshold: float = 0.05
    lr_scaling: str = "adascale"

    def __post_init__(self) -> None:
        whole("--global-batch", self.base_batch, 1)
        lo = whole("--min-global-batch", self.min_batch, 1)
        hi = whole("--max-global-batch", self.max_batch, 1)
        if lo > hi:
            raise ValueError(f"--min-global-batch {lo} exceeds --max-global-batch {hi}")
        if not lo <= self.base_batch <= hi:
            raise ValueError(f"--global-batch {self.base_batch} is outside [--min-global-batch {lo}, "
                             f"--max-global-batch {hi}]")
        threshold = finite("--adapt-threshold", self.threshold, 0.0, 1.0, open_high=True)
        if self.lr_scaling not in LR_SCALINGS:
            raise ValueError(f"--lr-scaling must be one of {', '.join(LR_SCALINGS)}, got {self.lr_scaling!r}")
        object.__setattr__(self, "threshold", threshold)


def lr_factor(rule: str, batch: int, base_batch: int, phi: float | None) -> float:
    """The factor on the job's learning rate at batch B (1 at B₀); adascale keeps 1 until φ is known."""
    ratio = batch / base_batch
    if rule == "linear":
        return ratio
    if rule == "sqrt":
        return math.sqrt(ratio)
    if rule == "adascale":
        return 1.0 if phi is None else ratio * statistical_efficiency(phi, batch, base_batch)
    raise ValueError(f"unknown lr scaling rule {rule!r}")


def candidates(lower: int, upper: int, current: int) -> list[int]:
    """The batches a decision compares: a geometric grid over [lower, upper], both ends and `current`."""
    points = {lower, upper, min(max(current, lower), upper)}
    if upper > lower:
        step = (upper / lower) ** (1.0 / (_GRID - 1))
        points.update(min(upper, max(lower, round(lower * step ** i))) for i in range(_GRID))
    return sorted(points)


@dataclass(frozen=True)
class Decision:
    """One decision: the batch chosen (== current when unchanged) and what it was based on."""

    batch: int
    current: int
    changed: bool
    gain: float | None  # predicted goodput(best)/goodput(current) − 1; None: nothing to compare
    phi: float | None
    efficiency: float | None  # E(batch) relative to B₀
    samples_per_s: float | None  # predicted throughput at `batch`
    reason: str
    gain_sd: float | None = None  # how far `gain` moves with φ one standard error either way

    def record(self) -> dict[str, Any]:
        """Fields for the metrics log's `adapt` record."""
        out = asdict(self)
        for key in ("gain", "gain_sd", "phi", "efficiency", "samples_per_s"):
            if out[key] is not None:
                out[key] = round(out[key], 6 if key.startswith("gain") else 3)
        return out


def goodput(throughput: float, phi: float, batch: int, base_batch: int) -> float:
    """Samples per second times the efficiency of a sample at `batch`: B₀-equivalent samples per second."""
    return throughput * statistical_efficiency(phi, batch, base_batch)


def gain_spread(rate_ratio: float, phi: float, phi_sd: float | None, batch: int, current: int) -> float:
    """How far the predicted gain of `batch` over `current` (throughput ratio `rate_ratio`) moves with φ
    one standard error either way (0 without one): E(B)/E(current) is monotone in φ, so the two ends bound it."""
    if not phi_sd:
        return 0.0

    def gain(p: float) -> float:
        return rate_ratio * (p + current) / (p + batch) - 1.0

    return max(abs(gain(p) - gain(phi)) for p in (max(0.0, phi - phi_sd), phi + phi_sd))


def choose(config: AdaptiveConfig, current: int, phi: float | None, lower: int, upper: int,
           round_ms: Callable[[int], float] | None, upward_only: bool = False,
           phi_sd: float | None = None, measurable: Callable[[int], bool] | None = None) -> Decision:
    """The batch to train at next. `lower`/`upper` are the flags' range narrowed to what the workers'
    bounds can make up; `round_ms(B)` the predicted time of a round of B (None: not measured yet).
    Unchanged (with the reason) while φ or the round time is unknown, or the gain is below the
    threshold or within what GAIN_SDS of φ's standard error `phi_sd` could explain (`gain_spread`).
    `upward_only`: `round_ms` is performance.measured_round's guess, which overvalues a smaller B (it counts the
    workers' fixed costs as per-sample time) and undervalues a larger one, so only a move up is
    trusted (inside the bounds; a B outside them still moves in).
    `measurable(B)`: whether φ can still be measured at B (two or more workers train there,
    gns.py); inside the bounds a move goes only where it can, so that the rounds after it can check
    it (`review`) and φ keeps following training instead of freezing at the value that made the move;
    where it cannot at B now (the policy parked all but one worker after B moved there), B moves to
    the best batch where it can, whatever the gain."""
    lo, hi = max(lower, config.min_batch), min(upper, config.max_batch)

    def unchanged(reason: str, gain: float | None = None) -> Decision:
        eff = None if phi is None else statistical_efficiency(phi, current, config.base_batch)
        rate = None
        if round_ms is not None and round_ms(current) > 0:
            rate = current / round_ms(current) * 1000.0
        return Decision(current, current, False, gain, phi, eff, rate, reason)

    if phi is None:
        return unchanged("noise scale not known yet")
    if round_ms is None:
        return unchanged("round time not measured yet")
    if lo > hi:
        return unchanged(f"the workers' bounds allow no batch in [{config.min_batch}, {config.max_batch}]")

    def value(b: int) -> float:
        t = round_ms(b)
        return goodput(b / t * 1000.0, phi, b, config.base_batch) if t > 0 else 0.0

    now = value(current)
    inside = lo <= current <= hi
    # B now where φ cannot be measured (the policy's plan trains one worker): φ would stay frozen at
    # its value for as long as B stays, so B moves to the best batch where it can be, gain or not
    frozen = inside and measurable is not None and not measurable(current)
    pool = [b for b in candidates(lo, hi, current) if (b >= current or not (upward_only and inside))
            and (not frozen if b == current else not inside or measurable is None or measurable(b))] or [current]
    best = max(pool, key=lambda b: (value(b), -abs(b - current)))
    gain = value(best) / now - 1.0 if now > 0 else None
    spread = None
    if gain is not None:
        spread = gain_spread((gain + 1.0) * (phi + best) / (phi + current), phi, phi_sd, best, current)
    gated = inside and not frozen  # a move from a frozen B needs no gain
    if best == current or (gated and (gain is None or gain < config.threshold)):
        reason = "gain below --adapt-threshold" if best != current else "the current batch is best"
        return replace(unchanged(reason, gain), gain_sd=spread)
    if gated and spread is not None and gain is not None and gain <= GAIN_SDS * spread:
        return replace(unchanged("gain within the noise scale's uncertainty", gain), gain_sd=spread)
    t = round_ms(best)
    reason = UNMEASURABLE if frozen else "goodput" if inside else OUTSIDE
    return Decision(best, current, True, gain, phi, statistical_efficiency(phi, best, config.base_batch),
                    best / t * 1000.0 if t > 0 else None, reason, spread)


def epoch_bound(upper: int, samples_per_epoch: int, min_steps: int = MIN_STEPS_PER_EPOCH) -> int:
    """The largest B to consider: `upper`, narrowed so that an epoch holds at least `min_steps` rounds."""
    return max(1, min(upper, samples_per_epoch // min_steps))


def probe_batch(current: int, lower: int, upper: int, phi: float | None = None,
                round_ms: Callable[[int], float] | None = None, base_batch: int | None = None,
                measurable: Callable[[int], bool] | None = None) -> int | None:
    """A second batch to measure rounds at while only B now has been (under a policy without a fitted
    model the round time at another B is a guess until measured): twice B or half B, clamped to
    [lower, upper] and where φ stays measurable (`measurable`, as for `choose`: a probe that trains
    one worker alone freezes φ for as long as it lasts); None where none is. Where both are left, the
    one whose goodput the guess `round_ms` at φ predicts higher (the guess counts a round's fixed
    costs as per-sample time, so it favours the smaller batch: a probe down is taken where the
    efficiency lost by growing B is worth more than the guess's throughput gain); without them, twice B."""
    up, down = min(upper, 2 * current), max(lower, current // 2)
    inside = [b for b in (up, down) if lower <= b <= upper and b != current and (measurable is None or measurable(b))]
    if len(inside) == 2 and phi is not None and round_ms is not None and base_batch is not None:
        return max(inside, key=lambda b: measured_goodput(b, round_ms(b), phi, base_batch))
    return inside[0] if inside else None


def measured_goodput(batch: int, round_ms: float, phi: float, base_batch: int) -> float:
    """Goodput at `batch` from its measured median round (B₀-equivalent samples per second)."""
    return goodput(batch / round_ms * 1000.0, phi, batch, base_batch) if round_ms > 0 else 0.0


def contradicted(previous: int, current: int, rounds: Mapping[int, float], phi: float | None, base_batch: int,
                 noise: Mapping[int, float] | None = None) -> bool:
    """Whether the rounds measured at both batches show that the move previous -> current lost
    goodput (at φ now) by more than NOISE_SDS of their noise (`noise`: each median round's relative
    standard error; none: any loss): the decision is then taken back. False while either is unmeasured."""
    if phi is None or previous not in rounds or current not in rounds:
        return False
    noise = noise or {}
    tolerance = NOISE_SDS * math.hypot(noise.get(previous, 0.0), noise.get(current, 0.0))
    return (measured_goodput(current, rounds[current], phi, base_batch)
            < measured_goodput(previous, rounds[previous], phi, base_batch) * (1.0 - tolerance))


def moved(config: AdaptiveConfig, current: int, batch: int, phi: float | None, reason: str,
          round_ms: Callable[[int], float] | None = None) -> Decision:
    """A decision to train at `batch` that the goodput scan did not make (a probe, a take-back)."""
    eff = None if phi is None else statistical_efficiency(phi, batch, config.base_batch)
    t = round_ms(batch) if round_ms is not None else None
    return Decision(batch, current, batch != current, None, phi, eff, batch / t * 1000.0 if t else None, reason)


class AdaptiveBatch:
    """The decision's state: B now, φ at the last decision, the decisions taken and their changes, the
    goodput move under review (`previous`: the B it left, until the move is measured) and the
    directions closed by take-backs (`closed`: "up"/"down" -> [the batch B may not pass, decisions left])."""

    def __init__(self, config: AdaptiveConfig) -> None:
        self.config = config
        self.batch = config.base_batch
        self.phi: float | None = None
        self.decisions = 0
        self.changes = 0
        self.last: Decision | None = None
        self.previous: int | None = None
        self.closed: dict[str, list[int]] = {}

    def bounds(self, lower: int, upper: int) -> tuple[int, int]:
        """[lower, upper] narrowed by the closed directions."""
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
        lo, hi = self.bounds(lower, upper)
        return self.note(choose(self.config, self.batch, phi, lo, hi, round_ms, upward_only, phi_sd, measurable))

    def review(self, phi: float | None, rounds: Mapping[int, float], noise: Mapping[int, float],
               round_ms: Callable[[int], float] | None = None) -> Decision | None:
        """The goodput move under review, if any: a decision to wait while the batch moved to is not
        measured yet (`rounds`: the median round measured at each B, `noise` its relative standard
        error), a take-back to the batch before where the measured goodput contradicts the move
        (`contradicted`; the move's direction is then closed for TAKE_BACK_MEMORY decisions), else
        None (the move stands and is no longer under review)."""
        previous, current = self.previous, self.batch
        if previous is None or phi is None:
            return None
        if current not in rounds:
            return self.note(moved(self.config, current, current, phi, "measuring the batch moved to", round_ms))
        self.previous = None
        if not contradicted(previous, current, rounds, phi, self.config.base_batch, noise):
            return None
        self.closed["up" if previous < current else "down"] = [previous, TAKE_BACK_MEMORY + 1]
        return self.note(moved(self.config, current, previous, phi, "taken back: measured goodput fell"))

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
        return decision

    def apply(self, decision: Decision) -> None:
        """The decision's batch is now B; a goodput move is under review until measured. A move away
        from a B where φ was not measurable closes the way back for TAKE_BACK_MEMORY decisions: the
        plan a goodput move would install there can differ from the one its check predicted (on HL8
        B went 83 -> 77 -> 83 three times, each 77 run on one worker)."""
        if decision.changed and decision.batch != self.batch:
            if decision.reason == UNMEASURABLE:
                self.closed["down" if decision.batch > self.batch else "up"] = [decision.batch, TAKE_BACK_MEMORY]
            self.previous = self.batch if decision.reason == "goodput" else None
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
                "closed": {k: list(v) for k, v in self.closed.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take a checkpoint's state, STATE_FORMAT or "adaptive-batch/1" (ValueError, nothing changed,
        on a malformed one or another B₀)."""
        if not isinstance(state, Mapping) or state.get("format") not in (STATE_FORMAT, "adaptive-batch/1"):
            raise ValueError(f"adaptive-batch state must be a mapping of format {STATE_FORMAT!r} "
                             "(or 'adaptive-batch/1')")
        if state.get("base_batch") != self.config.base_batch:
            raise ValueError(f"the checkpoint started at --global-batch {state.get('base_batch')!r}, "
                             f"not {self.config.base_batch}")
        batch = whole("adaptive batch", state.get("batch"), 1)
        phi = state.get("phi")
        phi = None if phi is None else finite("phi", phi, 0.0)
        decisions = whole("decisions", state.get("decisions"), 0)
        changes = whole("changes", state.get("changes"), 0)
        previous, closed = None, {}
        if state["format"] == STATE_FORMAT:
            previous = None if state.get("previous") is None else whole("previous batch", state.get("previous"), 1)
            closed = _closed(state.get("closed"))
        self.batch, self.phi, self.decisions, self.changes = batch, phi, decisions, changes
        self.previous, self.closed = previous, closed


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

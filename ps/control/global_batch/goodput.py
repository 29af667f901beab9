"""`--adaptive-batch gns`: the global batch B that maximises goodput, and the learning rate at it.

Goodput (Pollux, Cannikin §4) is progress per second: throughput(B), samples per second as the one
model of a round predicts a round of B (ps/control/performance.py), times the statistical efficiency E(B) = (φ + B₀)/(φ + B), the progress a
sample at batch B makes relative to one at the starting batch B₀ (φ the gradient noise scale,
ps/control/global_batch/gns.py). A larger B is faster per sample where a round has fixed costs, and worth less
per sample once B passes φ. `choose` scans B in [lower, upper] and moves only when the best predicted
goodput beats the current one by the threshold (a change costs re-measuring every worker) and by
what the noise scale's uncertainty could explain (the gain at φ ± its standard error). A goodput move
is measured at the batch it went to and taken back where the measured goodput fell by more than the
rounds' noise; that direction is then closed for TAKE_BACK_MEMORY decisions (decider.py, `AdaptiveBatch.review`).

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
STUCK = "the noise scale is not measurable at the current batch, nor at any batch it may move to"
"""The reason B stays where its plan trains one worker and no candidate's would train two (`choose`): φ
is then the value of the last round that measured it (the `adapt` record's `rounds` stays)."""
PROBE = "probe: a second batch for the round line"
"""The reason of a move to a second batch to measure rounds at (`probe_batch`); it is reviewed like a
goodput move, but stays only where its measured goodput is higher (decider.py)."""
MAX_STEP = 2.0
"""A goodput move inside the bounds goes at most this many times up or down from B now: its gain rests
on φ's reading of the moment and on the round model away from the batches measured, and the next
decision, a few rounds on, goes further if they still say so (on the CNN from B₀ = 64, φ read 225,
80 and then 6.3 within 16 rounds, and B went 128 → 23 in one move: 40 s to the target against 21 s
for B fixed at 64)."""
ESCAPE_STEP = 1.25
"""A move away from a B whose plan trains one worker goes at least this many times up where it can: a
few samples more, the policy parks the same worker again (on the image files from B₀ = 64, B crept
29 → 31 → 32 → 33 → 34, each run on one worker, a decision each)."""
ADAPT_THRESHOLD = 0.05
"""The default `--adapt-threshold`: the least predicted goodput gain a change of B needs."""
_GRID = 48
"""Candidate batches per decision: a geometric grid over [lower, upper] (plus both ends and B now)."""
MIN_STEPS_PER_EPOCH = 2 * DECIDE_EVERY
"""A candidate B leaves at least this many rounds in an epoch (`epoch_bound`): two decisions an epoch at
the default `--adapt-every`. A B near the training set's size makes one or two steps an epoch, too few
for the model to learn from or for a round time to be measured at it; and at one decision an epoch, a
B too large is corrected an epoch a step (from B₀ = 1,024 on the image files, bounded at 409, B spent
two epochs above 200). Digits' 1,438 training samples bound B at 89."""


@dataclass(frozen=True)
class AdaptiveConfig:
    """The settings of `--adaptive-batch gns`, validated on construction (ValueError naming the flag)."""

    base_batch: int
    min_batch: int
    max_batch: int
    threshold: float = ADAPT_THRESHOLD
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
    bounds can make up and to what leaves an epoch MIN_STEPS_PER_EPOCH rounds (`epoch_bound`);
    `round_ms(B)` the predicted time of a round of B (None: not measured yet).
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

    # B now where φ cannot be measured (the policy's plan trains one worker): φ would stay unknown, or
    # frozen at its value, for as long as B stays, so B moves where it can be, gain or not, and up where
    # any is (a smaller B gives fewer workers a share); with no goodput to compare, to the nearest
    escapes = _escapes(lo, hi, current, measurable)
    if phi is None or round_ms is None:
        if escapes:
            return moved(config, current, escapes[0], phi, UNMEASURABLE, round_ms)
        return unchanged("noise scale not known yet" if phi is None else "round time not measured yet")
    if lo > hi:
        return unchanged(f"no batch in [{config.min_batch}, {config.max_batch}] is within the workers' bounds and leaves "
                         f"an epoch {MIN_STEPS_PER_EPOCH} rounds")

    def value(b: int) -> float:
        t = round_ms(b)
        return goodput(b / t * 1000.0, phi, b, config.base_batch) if t > 0 else 0.0

    now = value(current)
    inside = lo <= current <= hi
    frozen = escapes is not None
    if escapes is not None:
        pool = [b for b in escapes if b >= current or not upward_only] or [current]
    else:
        # within MAX_STEP of B now first: `measurable` prices a plan, the window costs nothing
        pool = [b for b in candidates(lo, hi, current) if (b >= current or not (upward_only and inside))
                and (not inside or (current <= MAX_STEP * b and b <= MAX_STEP * current))
                and (b == current or not inside or measurable is None or measurable(b))] or [current]
    best = max(pool, key=lambda b: (value(b), -abs(b - current)))
    gain = value(best) / now - 1.0 if now > 0 else None
    spread = None
    if gain is not None:
        spread = gain_spread((gain + 1.0) * (phi + best) / (phi + current), phi, phi_sd, best, current)
    gated = inside and not frozen  # a move from a frozen B needs no gain
    if best == current or (gated and (gain is None or gain < config.threshold)):
        reason = "gain below --adapt-threshold" if best != current else STUCK if frozen else "the current batch is best"
        return replace(unchanged(reason, gain), gain_sd=spread)
    if gated and spread is not None and gain is not None and gain <= GAIN_SDS * spread:
        return replace(unchanged("gain within the noise scale's uncertainty", gain), gain_sd=spread)
    t = round_ms(best)
    reason = UNMEASURABLE if frozen else "goodput" if inside else OUTSIDE
    return Decision(best, current, True, gain, phi, statistical_efficiency(phi, best, config.base_batch),
                    best / t * 1000.0 if t > 0 else None, reason, spread)


def _escapes(lower: int, upper: int, current: int, measurable: Callable[[int], bool] | None) -> list[int] | None:
    """Where φ is not measurable at B now, inside the bounds: the candidates where it is, ESCAPE_STEP
    times B now or more, else those above B now, else those below it down to B now / MAX_STEP
    (`_upward`; nearest first; empty where none is); None where it is measurable at B now, or B now is
    outside the bounds."""
    if measurable is None or not lower <= current <= upper or measurable(current):
        return None
    return _upward([b for b in candidates(lower, upper, current) if measurable(b)], current)


def _upward(pool: list[int], current: int) -> list[int]:
    """Of `pool` (sorted), those ESCAPE_STEP times `current` or more, else those above it, else those
    below it no further than MAX_STEP times down, the nearest first. A move away from an unmeasurable B
    needs no gain, so one down is kept near: at the top of its range on HL8 the teacher's B went 512 → 4
    (the one batch predicted to train two workers), where a round of 4 samples ran at 1/100 of the rate."""
    for floor in (ESCAPE_STEP * current, current + 1):
        above = [b for b in pool if b >= floor]
        if above:
            return above
    return [b for b in reversed(pool) if b < current and MAX_STEP * b >= current]


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

"""Probes of changed workers held where a proportional line prices them, and the first batch of a
parked worker back in the plan. After a change of speed a worker's law is the proportional line
through its new times, and at a small batch that line overprices a worker whose time is mostly fixed
cost (one back from parking, or one of a few samples, that got faster); after a slowdown so may an
unchanged worker's old law, its speed-up hidden in that fixed cost. Where such a worker finishes
earlier than the slowest by more than the deadband, yet the decision would not move it SPREAD up, it
is moved SPREAD up whatever the gain, so that its next times give it a law (law.py). A worker the decision parks is not probed: its times at
its minimum already finish after the round it solved for, and a probe would bring it back while it is
counted as parked.

A parked worker's speed is not measured, and the solve gives one brought back (a recall, a re-probe)
the batch its law from before parking finishes within the solved round: where the others absorb a
slowdown that round is short, and that batch the minimum, where a step is almost all fixed cost and
its time tells nothing of its speed per sample. So it comes back at the batch its known law finishes
within the round measured now (`entry_targets`), and the others share what it leaves. Without a
known law (a line through the origin, as after a change seen at its minimum batch) or with a law fitted
flat (its time per sample not measured) a recalled worker comes back at its cores' share of B (the load seen to slow another may have left its machine); a
re-probed one near the batch its line finishes within that round, a batch size SPREAD from the one
the line was measured at (`line_entry`): a worker far slower than the others, parked after its first
batch, is re-probed at a few samples, not at a share of B hundreds of rounds long.

A re-probe is judged by the decision after it (the round judges it, model/fitted_plan.py), once its
rounds are measured; where a worker back for it is as far off the round it left as change.QUICK
trusts on one time or two, that decision comes at once (`far_off`): a worker whose fixed cost alone
outlasts the others' round holds every round of its re-probe. Pure."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from ps.control.auto.change import QUICK
from ps.control.auto.law import SPREAD
from ps.control.performance import FinishTime, batch_within
from ps.control.split import fit_to_sum, reachable


def probe_targets(candidates: Iterable[str], plan: Mapping[str, int], current: Mapping[str, int],
                  means: Mapping[str, float], lower: Mapping[str, int], upper: Mapping[str, int],
                  deadband: float, shaped: Mapping[str, FinishTime] | None = None) -> dict[str, int]:
    """Each of `candidates` (changed and on a proportional line, or unchanged after a slowdown) whose
    mean time (`means`) at its batch in `current` is earlier than the slowest's by more than `deadband`,
    and that `plan` keeps planned (not parked) below SPREAD up: the batch SPREAD up (within its bound),
    where that costs nothing even if its time is all proportional to its batch: scaled from its mean,
    it finishes within `plan`'s round (each planned worker's mean scaled to its batch there) and the
    deadband. A worker that slowed at a large batch finishes early only because a slower one holds the
    round up; the plan cuts its batch, and a probe up would make it the slowest. `shaped`: the priced
    times of workers on a line with their old law's shape (pricing.shaped), whose time at their batch
    in `plan` is that price, not their mean scaled (scaled, a sped-up worker's fixed cost raised the
    round so far that probes of twelve of sixteen workers took every sample from the other four)."""
    slowest = max(means.values(), default=0.0)
    shaped = shaped or {}
    level = max((shaped[k](plan[k]) if k in shaped else means[k] * plan[k] / current[k]
                 for k in means if current.get(k, 0) > 0 and plan.get(k, 0) > 0), default=0.0)
    out = {}
    for k in candidates:
        b = current.get(k, 0)
        up = b + max(2, math.ceil(SPREAD * b))
        early = k in means and means[k] < (1.0 - deadband) * slowest
        free = k in means and b > 0 and means[k] * up / b <= (1.0 + deadband) * level
        if early and free and 0 < plan[k] < up <= upper[k]:
            out[k] = up
    return out


def probe_plan(plan: Mapping[str, int], probes: Mapping[str, int], total: int, lower: Mapping[str, int],
               upper: Mapping[str, int], exact_sum: bool, for_time: bool) -> dict[str, int] | None:
    """`plan` with the `probes` at their batches and its other planned workers scaled to what they leave
    of `total` (the same ones parked; without `exact_sum`, as they are); None where their bounds cannot
    take it. `for_time`: rounded for the shortest round (split.fit_to_sum)."""
    if not exact_sum:
        return {**plan, **probes}
    rest = [k for k, b in plan.items() if b > 0 and k not in probes]
    left = total - sum(probes.values())
    if not rest or not reachable(rest, left, lower, upper):
        return None
    scaled = fit_to_sum({k: float(plan[k]) for k in rest}, left, {k: lower[k] for k in rest},
                        {k: upper[k] for k in rest}, for_time)
    return {**dict.fromkeys(plan, 0), **scaled, **probes}


def entry_targets(entering: Iterable[str], plan: Mapping[str, int], laws: Mapping[str, FinishTime], round_ms: float,
                  deadband: float, cores: Mapping[str, float], total: int, lower: Mapping[str, int],
                  upper: Mapping[str, int], lines: Mapping[str, tuple[FinishTime, int]] | None = None) -> dict[str, int]:
    """Each of `entering` (parked in the plan in force, planned in `plan`) at the largest batch its known
    law (`laws`) finishes within `round_ms` (the slowest mean time of the plan in force) and the
    `deadband` (where a step is almost all fixed cost, the batch within the round itself is as noisy
    as that round's mean), or on a line through the origin (`lines`: the line and the batch it was
    measured at) the batch of `line_entry`, or never measured its cores' share of `total` among the
    workers `plan` plans;
    no less than `plan` gives it, within its bounds, and all of them together leaving the others of
    `plan` their lower bounds (cut back towards `plan` alike)."""
    names = [k for k in entering if plan.get(k, 0) > 0]
    planned = [k for k, b in plan.items() if b > 0]
    mass = sum(cores[k] for k in planned)
    lines, level, wanted = lines or {}, (1.0 + deadband) * round_ms, {}
    for k in names:
        if k in laws:
            share = batch_within(laws[k], level, lower[k], upper[k])
        elif k in lines:
            share = line_entry(*lines[k], level, lower[k], upper[k])
        else:
            share = round(total * cores[k] / mass)
        wanted[k] = min(max(share, plan[k], lower[k]), upper[k])
    room = total - sum(lower[k] for k in planned if k not in wanted)
    asked, given = sum(wanted.values()), sum(plan[k] for k in wanted)
    if asked > max(room, given):
        scale = max(0, room - given) / (asked - given)
        wanted = {k: plan[k] + math.floor((b - plan[k]) * scale) for k, b in wanted.items()}
    return wanted


def line_entry(line: FinishTime, measured: int, level: float, lo: int, hi: int) -> int:
    """The batch a parked worker whose law is a line through the origin, through its times at batch
    `measured`, comes back at: the largest its line finishes within `level`, if SPREAD from `measured`
    (its time there then gives the worker its fixed cost, law.py); else the largest SPREAD below
    `measured`, or, below `lo`, the smallest SPREAD above it. The line overprices every batch above
    `measured` and underprices one below by at most the fixed cost, which its time at `measured`
    bounds: a worker far slower than the others comes back at a few samples, not at a share of B."""
    within = batch_within(line, level, lo, hi)
    if within >= measured * (1.0 + SPREAD) or within * (1.0 + SPREAD) <= measured:
        return within
    below = math.floor(measured / (1.0 + SPREAD))
    return below if below >= lo else min(measured + max(2, math.ceil(SPREAD * measured)), hi)


def far_off(times: Mapping[str, Sequence[float]], round_ms: float) -> bool:
    """Whether a worker back for a re-probe (`times`: each one's times since) took QUICK's ratio of
    `round_ms` (the measured round of the plan the re-probe left) or more on its newest so many times:
    no noise makes a time that far off (a stalled step stays below these), and each round until
    `min_samples` times come in waits for it."""
    return round_ms > 0 and any(len(t) >= n and all(ms >= ratio * round_ms for ms in t[-n:])
                                for t in times.values() for ratio, n in QUICK)

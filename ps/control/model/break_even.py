"""The break-even batch of a worker, and the plan that parks the workers planned below theirs
(--adaptive-batch with the model and auto policies in BSP).

A worker's finish time f(b) has a fixed part f(0) (its step's overhead, pushing and pulling the
whole model) and a part that grows with b (compute). Below its break-even batch, where f(b) − f(0)
< f(0), a round spends more of that worker's time on the fixed part than on samples: it adds a
whole model's traffic and its overhead to the round for a few samples. `park_below_break_even`
moves such a worker's share to the others (parked: batch 0), the one furthest below first, and
splits the total again, until every active worker is at or above its break-even, one worker is
left, or the rest cannot make up the total within their bounds. The worker with the plan's largest
share is never parked so: it carries the round, and the rule is for a worker that adds its fixed
cost to the round for a few samples (on the teacher MLP the full-core worker's fixed cost, 4 ms,
was above its compute at 486 of 512 samples, and parking it left the round to a 3/16-core worker at
about 200 ms against 6). A proportional law (no fixed cost) is never below. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from ps.control.performance import FinishTime, batch_within, split
from ps.control.split import reachable


def compute_share(time: FinishTime, batch: int) -> float:
    """(f(b) − f(0))/f(0): compute over the fixed part at `batch` (math.inf without a fixed part)."""
    fixed = time(0)
    return float("inf") if fixed <= 0 else (time(batch) - fixed) / fixed


def below_break_even(time: FinishTime, batch: int) -> bool:
    """Whether an active worker at `batch` spends more of its round on its fixed part than on samples."""
    return batch > 0 and compute_share(time, batch) < 1.0


def break_even_batch(time: FinishTime, upper: int) -> int:
    """The least batch in [1, upper] at or above the break-even of `time` (`upper` where none is; 1
    without a fixed part)."""
    fixed = time(0)
    if fixed <= 0:
        return 1
    b = batch_within(time, 2.0 * fixed, 1, upper)
    return min(upper, b if time(b) >= 2.0 * fixed else b + 1)


def raised_to_break_even(laws: Mapping[str, FinishTime], lower: Mapping[str, int], upper: Mapping[str, int],
                         workers: Iterable[str], total: int) -> dict[str, int]:
    """`lower` with each of `workers` that has a law raised to its break-even batch (a worker brought
    back to be measured runs where it pays for its round), where the bounds' sum still fits in `total`."""
    raised = dict(lower)
    for k in workers:
        if k in laws:
            floor = max(lower[k], break_even_batch(laws[k], upper[k]))
            if sum(raised.values()) - raised[k] + floor <= total:
                raised[k] = floor
    return raised


def carrying(plan: Mapping[str, int]) -> str | None:
    """The active worker with the plan's largest batch (the first named of those tied; None: none active)."""
    return max((k for k, b in plan.items() if b > 0), key=lambda k: plan[k], default=None)


def parked_one_by_one(laws: Mapping[str, FinishTime], plan_without: Callable[[list[str]], dict[str, int] | None],
                      may_park: Iterable[str]) -> tuple[dict[str, int], list[str]]:
    """The plan `plan_without([])` makes, with the workers of `may_park` that `laws` put below their
    break-even parked one at a time, the one furthest below first, the plan made again without those
    parked each time (`plan_without(parked)`; None where the others cannot make up the total), until
    none is below, one worker is left, or none of those below can be parked; the plan and the workers
    it parked (in the order parked). A worker without a law is never parked here, nor the active worker
    with the largest batch (`carrying`)."""
    parked: list[str] = []
    first, candidates = plan_without(parked), set(may_park)
    if first is None:
        raise ValueError("plan_without([]) made no plan")
    plan = first
    while True:
        active, carrier = [k for k, b in plan.items() if b > 0], carrying(plan)
        below = sorted((k for k in active if k in candidates and k != carrier and k in laws
                        and below_break_even(laws[k], plan[k])), key=lambda k: compute_share(laws[k], plan[k]))
        if len(active) < 2 or not below:
            return plan, parked
        for k in below:
            again = plan_without([*parked, k])
            if again is not None:
                plan, parked = again, [*parked, k]
                break
        else:
            return plan, parked


def park_below_break_even(times: Mapping[str, FinishTime], laws: Mapping[str, FinishTime], plan: Mapping[str, int],
                          lower: Mapping[str, int], upper: Mapping[str, int],
                          may_park: Iterable[str]) -> tuple[dict[str, int], list[str]]:
    """`plan` with the workers of `may_park` that `laws` put below their break-even parked, each
    one's share split again over the others by `times` (performance.split; `parked_one_by_one`)."""
    total, active = sum(plan.values()), [k for k, b in plan.items() if b > 0]

    def without(parked: list[str]) -> dict[str, int] | None:
        if not parked:
            return dict(plan)
        rest = [j for j in active if j not in parked]
        if not reachable(rest, total, lower, upper):
            return None
        return {**dict.fromkeys(plan, 0), **split({j: times[j] for j in rest}, total, lower, upper)}

    return parked_one_by_one(laws, without, may_park)

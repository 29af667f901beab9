"""ps.control.auto.change: a change of speed is found where the newest times leave the law by more
than the noise for a few rounds (fewer, far off it), and starts where they left it; noise, one
stalled step, or the fixed cost a proportional line does not know yet are no change. And the law a
change's first times are admitted into (law.py)."""

from __future__ import annotations

import random

import pytest

from ps.control.auto.change import CHANGE_ROUNDS, SETTLE_EVERY, WINDOW, change_start, change_starts, relative_noise, settled_mark
from ps.control.auto.law import law_of

Item = tuple[int, int, float, float | None]


def history(times: list[tuple[int, float]]) -> list[Item]:
    return [(seq, b, ms, None) for seq, (b, ms) in enumerate(times)]


def law_then(batch_times: list[tuple[int, float]], newest: list[tuple[int, float]]) -> tuple[list[Item], int]:
    """Settled times, then the newest ones: the items and the settled mark between them."""
    items = history(batch_times + newest)
    return items, len(batch_times)


def noisy(rnd: random.Random, batch: int, q: float, s: float, n: int, noise: float) -> list[tuple[int, float]]:
    return [(batch, (q * batch + s) * (1 + rnd.gauss(0, noise))) for _ in range(n)]


def test_a_halved_speed_is_found_after_a_few_rounds_and_starts_where_it_began() -> None:
    rnd = random.Random(0)
    settled = noisy(rnd, 32, 1.0, 10.0, 8, 0.02) + noisy(rnd, 64, 1.0, 10.0, 8, 0.02)
    before_change = noisy(rnd, 64, 1.0, 10.0, 2, 0.02)
    for after in range(1, 6):
        items, mark = law_then(settled, before_change + noisy(random.Random(after), 64, 2.0, 20.0, after, 0.02))
        start = change_start(items, mark, 3, 0.1)
        if after < CHANGE_ROUNDS:
            assert start is None  # too few rounds to tell
        else:
            assert start == len(settled) + len(before_change)  # the first time after the change


@pytest.mark.parametrize(("factor", "rounds", "found"), [(8.0, 1, True), (0.2, 1, True), (3.0, 1, False),
                                                       (3.0, 2, True), (0.35, 2, True), (2.0, 2, False)])
def test_times_far_off_the_law_are_a_change_on_fewer_rounds(factor: float, rounds: int, found: bool) -> None:
    """QUICK: one time four times off the law (either way) is a change at once, two in a row 2.5 times
    off; nearer, the change waits for CHANGE_ROUNDS times."""
    rnd = random.Random(2)
    settled = noisy(rnd, 32, 1.0, 10.0, 8, 0.02) + noisy(rnd, 64, 1.0, 10.0, 8, 0.02)
    items, mark = law_then(settled, [(64, 74.0 * factor)] * rounds)
    assert (change_start(items, mark, 3, 0.1) == len(settled)) is found


def test_an_admitted_batch_enters_the_law_only_far_from_the_measured_ones() -> None:
    """One time at a batch size admitted (a change trusted on it) identifies the fixed cost with the
    times measured at another batch ADMIT_SPREAD away, never nearer: there its noise would tilt the line."""
    measured = [(i, 103, 855.0 + i, None) for i in range(6)]
    near = [(10, 124, 866.0, None), *[(11 + i, b, ms, None) for i, (_, b, ms, _) in enumerate(measured)]]
    assert not law_of(near, 3, admitted=124).known
    far = [(10, 260, 2000.0, None), *[(11 + i, b, ms, None) for i, (_, b, ms, _) in enumerate(measured)]]
    law = law_of(far, 3, admitted=260)
    assert law.known and law.fit.line.q == pytest.approx((2000.0 - 858.0) / (260 - 103), rel=0.05)
    assert not law_of(far, 3).known


def test_an_admitted_batch_measured_twice_enters_the_law_nearer() -> None:
    """Two times at the admitted batch size (a change trusted on two rounds) enter the law
    ADMIT_SPREAD_TWICE from the measured ones: the batch each worker had when every quota changed at
    once is 1.5-1.7 times the one the step gives it, and without them the next decision steps again."""
    measured = [(10 + i, 80, 700.0 + i, None) for i in range(3)]
    two = [(0, 134, 1083.0, None), (1, 134, 1090.0, None), *measured]
    law = law_of(two, 3, admitted=134)
    assert law.known and law.fit.line.q == pytest.approx((1086.5 - 701.0) / (134 - 80), rel=0.05)
    one = [(1, 134, 1090.0, None), *measured]
    assert not law_of(one, 3, admitted=134).known  # one time: ADMIT_SPREAD away
    near = [(0, 110, 950.0, None), (1, 110, 955.0, None), *measured]
    assert not law_of(near, 3, admitted=110).known


def test_noise_alone_is_no_change() -> None:
    alarms = 0
    for seed in range(200):
        rnd = random.Random(seed)
        items, mark = law_then(noisy(rnd, 32, 1.0, 10.0, 8, 0.1) + noisy(rnd, 64, 1.0, 10.0, 8, 0.1),
                               noisy(rnd, 64, 1.0, 10.0, WINDOW, 0.1))
        alarms += change_start(items, mark, 3, 0.1) is not None
    assert alarms <= 1


def test_one_stalled_step_is_no_change() -> None:
    rnd = random.Random(1)
    newest = noisy(rnd, 64, 1.0, 10.0, 5, 0.02)
    newest[2] = (64, 740.0)
    items, mark = law_then(noisy(rnd, 32, 1.0, 10.0, 8, 0.02) + noisy(rnd, 64, 1.0, 10.0, 8, 0.02), newest)
    assert change_start(items, mark, 3, 0.1) is None


def test_a_change_within_twice_the_deadband_is_left_to_the_laws_recency_weights() -> None:
    rnd = random.Random(2)
    items, mark = law_then(noisy(rnd, 32, 1.0, 10.0, 8, 0.01) + noisy(rnd, 64, 1.0, 10.0, 8, 0.01),
                           noisy(rnd, 64, 1.15, 11.5, WINDOW, 0.01))
    assert change_start(items, mark, 3, 0.1) is None
    assert change_start(items, mark, 3, 0.05) is not None


@pytest.mark.parametrize(("batch", "ms", "changed"), [
    (8, 8 * 1.0 + 100.0, False),  # slower than the line through 64 by its fixed cost: not a change
    (8, 10.0, True),   # faster than the line through 64 at a smaller batch: no fixed cost explains that
    (128, 128 * 1.0 + 100.0, False),  # faster than the line at a larger batch: the fixed cost again
    (128, 2 * (64 * 1.0 + 100.0) * 1.6, True),  # far slower than the line: a change
])
def test_a_proportional_line_is_off_by_the_fixed_cost_it_does_not_know_and_no_more(
        batch: int, ms: float, changed: bool) -> None:
    """The law through one batch size (64) is the line through the origin; times at another batch may
    be off it by up to the ratio of the batches, on the side a fixed cost puts them."""
    items, mark = law_then([(64, 164.0)] * 6, [(batch, ms)] * 4)
    assert (change_start(items, mark, 3, 0.1) is not None) == changed


def test_the_settled_mark_leaves_the_newest_window_unsettled_and_moves_every_settle_every() -> None:
    items = history([(32, 10.0)] * (WINDOW + 5))
    assert settled_mark(items, 0) == 5
    assert settled_mark(items[:WINDOW], 0) == 0
    assert settled_mark(items, 9) == 9
    # fewer than WINDOW + SETTLE_EVERY unsettled: the mark stays where it is
    assert settled_mark(items, 5 - SETTLE_EVERY + 1) == 5 - SETTLE_EVERY + 1
    assert settled_mark(items, 5 - SETTLE_EVERY) == 5


def test_the_noise_is_estimated_per_batch_size_and_a_stall_counts_little() -> None:
    rnd = random.Random(4)
    items = history(noisy(rnd, 32, 1.0, 0.0, 40, 0.05) + noisy(rnd, 128, 1.0, 0.0, 40, 0.05))
    assert relative_noise(items) == pytest.approx(0.05, rel=0.25)
    stalled = items + [(len(items), 32, 3200.0, None)]
    assert relative_noise(stalled) < 0.08
    assert relative_noise([]) == pytest.approx(0.1)  # the prior alone


def test_a_kept_law_whose_settled_times_were_all_dropped_tests_the_newest_on_its_line_alone() -> None:
    """A worker's settled law is kept while its observations are pruned; once none of the times it was
    fitted from is left, the newest times are tested against its line's own error (a property test of
    the auto policy found the decision's test of them failing on an empty list, inside a push)."""
    rnd = random.Random(0)
    items = [(i, 32 if i % 2 else 16, (0.5 * (32 if i % 2 else 16) + 5.0) * (1.0 + rnd.gauss(0.0, 0.02)), None)
             for i in range(10)]
    law = law_of(items[:6], 1)
    assert law is not None
    newest = [(i, 32, 40.0, None) for i in range(10, 14)]  # twice the law's 21 ms: a change
    assert change_starts(newest, 10, 1, 0.1, ((4.5, 3),), settled_law=lambda _, __: law) == [10]
    assert change_starts(items[6:], 6, 1, 0.1, ((4.5, 3),), settled_law=lambda _, __: law) == [None]

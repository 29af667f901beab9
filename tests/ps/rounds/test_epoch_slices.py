"""Exactly-once epochs, the pure parts: the permutation every process computes alike, the server's
slice core under any sequence of plans, put-backs and removals (hypothesis), its checkpoint state, and
the worker's check of a slice it is handed."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from common.job.epoch_order import epoch_permutation, slice_indices
from common.transport.messages import SliceRange, StepHeader
from ps.rounds.epoch_slices import Coverage, EpochSlices
from worker.data.slices import BadSlice, check_slice

PROPERTY = settings(max_examples=150, deadline=None)


def test_a_permutation_is_the_same_in_another_process_and_differs_between_epochs() -> None:
    here = epoch_permutation(7, 3, 1000)
    code = "from common.job.epoch_order import epoch_permutation; print(epoch_permutation(7, 3, 1000).tolist())"
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert here.tolist() == eval(there)  # noqa: S307 - a list of ints printed by the child
    assert sorted(here.tolist()) == list(range(1000))
    assert not torch.equal(here, epoch_permutation(7, 4, 1000))
    assert not torch.equal(here, epoch_permutation(8, 3, 1000))


def test_slice_indices_are_the_ranges_of_each_epochs_permutation() -> None:
    ranges = (SliceRange(0, 990, 10), SliceRange(1, 0, 5))
    got = slice_indices(1, 1000, ranges)
    assert got.tolist() == epoch_permutation(1, 0, 1000)[990:].tolist() + epoch_permutation(1, 1, 1000)[:5].tolist()


def test_a_round_in_plan_order_hands_contiguous_ranges_summing_to_b() -> None:
    slices = EpochSlices(100)
    plan = {"a": 10, "b": 30, "c": 20}
    got = {name: slices.hand(name, b) for name, b in plan.items()}
    assert got == {"a": (SliceRange(0, 0, 10),), "b": (SliceRange(0, 10, 30),), "c": (SliceRange(0, 40, 20),)}
    assert slices.cursor == 60


def test_the_last_round_wraps_into_the_next_epochs_permutation() -> None:
    slices = EpochSlices(90)
    for _ in range(2):
        for name in "ab":
            slices.hand(name, 20)
            slices.consume(name)
    assert slices.completed == 0
    assert slices.hand("a", 20) == (SliceRange(0, 80, 10), SliceRange(1, 0, 10))
    slices.consume("a")
    assert slices.completed == 1 and slices.report()["trained"] == {"0": 90, "1": 10}


def test_a_slice_put_back_is_served_first_and_its_epoch_waits_for_it() -> None:
    slices = EpochSlices(30)
    slices.hand("a", 10)
    slices.hand("b", 20)
    slices.consume("b")
    slices.put_back("a")  # evicted
    assert slices.completed == 0 and slices.cursor == 30
    assert slices.hand("c", 15) == (SliceRange(0, 0, 10), SliceRange(1, 0, 5))
    slices.consume("c")
    assert slices.completed == 1
    assert slices.report()["put_back_samples"] == 10


def test_the_same_reply_again_sends_the_same_slice_and_a_new_size_a_new_one() -> None:
    slices = EpochSlices(100)
    first = slices.hand("a", 10, key=4)
    assert slices.hand("a", 10, key=4) == first  # a pull after a refused push: the same samples
    # re-split: the old slice goes back and is served first, the rest follows from the cursor
    assert slices.hand("a", 12, key=4) == (SliceRange(0, 0, 12),)
    assert slices.hand("b", 5) == (SliceRange(0, 12, 5),)
    assert slices.report()["put_back_samples"] == 10


def test_a_slice_handed_ahead_becomes_the_next_only_at_its_size_and_key() -> None:
    slices = EpochSlices(100)
    assert slices.hand("a", 10, key=1) == (SliceRange(0, 0, 10),)
    assert slices.hand(("a", "ahead"), 10, key=2) == (SliceRange(0, 10, 10),)
    slices.consume("a")
    assert slices.promote(("a", "ahead"), "a", 10, key=2)
    assert slices.hand("a", 10, key=2) == (SliceRange(0, 10, 10),)  # the same samples, told a step early
    assert slices.hand(("a", "ahead"), 10, key=3) == (SliceRange(0, 20, 10),)
    slices.consume("a")
    assert not slices.promote(("a", "ahead"), "a", 12, key=3)  # re-split: it goes back and is served first
    assert ("a", "ahead") not in slices.held
    assert slices.hand("a", 12, key=3) == (SliceRange(0, 20, 12),)
    assert slices.report()["put_back_samples"] == 0  # no step was told to train it: not a slice put back
    slices.hand(("a", "ahead"), 12, key=4, tally=False)
    assert slices.hand(("a", "ahead"), 10, key=4, tally=False) == (SliceRange(0, 32, 10),)  # re-sized ahead
    assert slices.report()["put_back_samples"] == 0  # the one it replaced went back uncounted too


def test_coverage_refuses_an_overlap_and_joins_neighbours() -> None:
    c = Coverage()
    assert c.add(10, 20) and c.add(0, 10) and c.add(20, 25)
    assert (c.starts, c.stops, c.samples) == ([0], [25], 25)
    assert not c.add(24, 30)
    assert c.samples == 25


@st.composite
def schedules(draw: st.DrawFn) -> tuple[int, list[tuple[str, str, int]]]:
    """N and a sequence of (action, holder, size): hand, hand ahead, promote the slice ahead, consume,
    put back."""
    n = draw(st.integers(1, 60))
    steps = draw(st.lists(st.tuples(st.sampled_from(["hand", "ahead", "promote", "consume", "consume", "put_back"]),
                                    st.sampled_from("abcd"), st.integers(1, 25)), max_size=80))
    return n, steps


def replay(slices: EpochSlices, steps: list[tuple[str, str, int]], trained: Counter) -> None:
    for action, holder, size in steps:
        if action == "hand":
            slices.hand(holder, size)
        elif action == "ahead":  # the slice after the next, handed a step early
            slices.hand((holder, "ahead"), size, key=1)
        elif action == "promote":
            slices.promote((holder, "ahead"), holder, size, key=1)
        elif action == "consume":
            for r in slices.held.get(holder, None).ranges if holder in slices.held else ():
                trained.update((r.epoch, p) for p in range(r.offset, r.stop))
            slices.consume(holder)
        else:
            slices.put_back(holder)


def drain(slices: EpochSlices, trained: Counter) -> None:
    """Put back whatever is out, then serve everything put back (a worker trains it)."""
    for holder in list(slices.held):
        slices.put_back(holder)
    while slices.returned:
        replay(slices, [("hand", "z", sum(r.count for r in slices.returned)), ("consume", "z", 0)], trained)


@PROPERTY
@given(schedules())
def test_any_sequence_of_plans_and_put_backs_trains_each_sample_once_per_epoch(case) -> None:
    n, steps = case
    slices = EpochSlices(n)
    trained: Counter = Counter()
    replay(slices, steps, trained)
    assert all(count == 1 for count in trained.values())  # never twice, whatever happened
    drain(slices, trained)
    assert all(count == 1 for count in trained.values())
    for e in range(slices.completed):
        assert {p for (epoch, p) in trained if epoch == e} == set(range(n))
    assert slices.overlaps == 0


@PROPERTY
@given(schedules(), st.integers(0, 80))
def test_a_checkpoint_taken_anywhere_resumes_to_the_same_samples(case, cut) -> None:
    n, steps = case
    slices = EpochSlices(n)
    trained: Counter = Counter()
    replay(slices, steps[:cut], trained)
    state = slices.state_dict()  # what is out is saved as put back: the resumed job serves it again
    resumed = EpochSlices.from_state(n, state, slices.completed)
    assert resumed.completed == slices.completed
    replay(resumed, steps[cut:], trained)
    drain(resumed, trained)
    assert all(count == 1 for count in trained.values())
    for e in range(resumed.completed):
        assert {p for (epoch, p) in trained if epoch == e} == set(range(n))


def test_a_checkpoint_from_before_exact_epochs_starts_its_epoch_afresh() -> None:
    slices = EpochSlices.from_state(100, {"epoch": 3}, 3)
    assert (slices.epoch, slices.cursor, slices.completed) == (3, 0, 3)


def test_a_bad_checkpoint_state_is_refused() -> None:
    with pytest.raises(ValueError, match="slice state out of range"):
        EpochSlices(10, epoch=1, cursor=5, put_back=[SliceRange(1, 4, 3)])


def plan(batch: int, *ranges: SliceRange, epoch: int = 0) -> StepHeader:
    return StepHeader(round=1, version=1, epoch=epoch, batch_size=batch, done=False, lr=0.1, global_batch=batch,
                      slice=tuple(ranges))


def ahead(header: StepHeader, *ranges: SliceRange) -> StepHeader:
    return dataclasses.replace(header, next_slice=tuple(ranges))


@pytest.mark.parametrize(("header", "says"), [
    (plan(10, SliceRange(0, 95, 10)), r"samples \[95, 105\) of epoch 0, outside this worker's 100"),
    (plan(10, SliceRange(0, 0, 8)), "a slice of 8 samples for a batch of 10"),
    (plan(10), "a slice of 0 samples for a batch of 10"),
    (plan(10, SliceRange(0, 0, 10), epoch=1), "of epoch 0, outside"),
    (plan(10, SliceRange(9, 0, 10)), "of epoch 9, outside"),
    (ahead(plan(10, SliceRange(0, 0, 10)), SliceRange(0, 10, 9)), "a slice ahead of 9 samples for a batch of 10"),
    (ahead(plan(10, SliceRange(0, 0, 10)), SliceRange(0, 95, 10)), r"samples \[95, 105\) of epoch 0, outside"),
])
def test_a_worker_refuses_a_slice_it_cannot_train_on(header: StepHeader, says: str) -> None:
    with pytest.raises(BadSlice, match=says):
        check_slice(header, 100, last_epoch=5)


def test_a_worker_takes_a_slice_that_wraps_into_the_next_epoch() -> None:
    check_slice(plan(10, SliceRange(2, 95, 5), SliceRange(3, 0, 5), epoch=2), 100, last_epoch=5)


def test_nothing_is_handed_past_the_last_epoch_and_a_slice_put_back_is_served_after() -> None:
    slices = EpochSlices(10, last_epoch=1)
    slices.hand("stalled", 4)
    assert slices.hand("a", 16) == (SliceRange(0, 4, 6), SliceRange(1, 0, 10))
    slices.consume("a")
    assert slices.hand("b", 5) == ()  # the last epoch ran out: b waits
    assert "b" not in slices.held
    slices.put_back("stalled")  # evicted
    assert slices.hand("b", 5) == (SliceRange(0, 0, 4),)
    slices.consume("b")
    assert slices.completed == 2

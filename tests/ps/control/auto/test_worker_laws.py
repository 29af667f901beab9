"""Every worker's observations and law (ps/control/auto/worker_laws.py): a change of speed forgets the
times before it, and a first time that straddles the change is not taken for the new speed. Pure."""

from __future__ import annotations

import random
import statistics

import pytest

from ps.control.auto.change import ALONG_TESTS, SETTLE_EVERY, change_start
from ps.control.auto.law import Choice
from ps.control.auto.worker_laws import WorkerLaws, largest_error
from ps.control.model.observations import Observations
from ps.control.model.worker_times import WARMUP


def laws_after(times: list[tuple[int, float]]) -> WorkerLaws:
    """Laws of one worker `w` that recorded `times` (batch, ms) after its warm-up."""
    laws = WorkerLaws(min_samples=3, deadband=0.1)
    laws.add("w")
    for _ in range(WARMUP):
        laws.record("w", 100, 1000.0, None)
    for batch, ms in times:
        laws.record("w", batch, ms, None)
    return laws


def settled(rnd: random.Random) -> list[tuple[int, float]]:
    """Twenty rounds at batch 100 and 1000 ms (2% noise)."""
    return [(100, 1000.0 * (1 + rnd.gauss(0.0, 0.02))) for _ in range(20)]


@pytest.mark.parametrize("share_before", [0.3, 0.45])
def test_a_first_time_that_straddles_a_slowdown_is_not_the_new_speed(share_before: float) -> None:
    """Twice as slow from a round in which `share_before` of the step ran at the old speed: the law
    after the change is the new speed's (2000 ms), not pulled toward the straddling time."""
    rnd = random.Random(1)
    straddling = share_before * 1000.0 + (1.0 - share_before) * 2000.0
    laws = laws_after([*settled(rnd), (100, straddling), (100, 2010.0), (100, 1990.0), (100, 2000.0)])
    assert laws.changed == {"w"}
    assert [ms for _, _, ms, _ in laws.obs["w"].items][0] != straddling
    assert laws.law("w").fit.finish.at(100) == pytest.approx(2000.0, rel=0.02)


def test_a_first_time_at_the_new_speed_is_kept() -> None:
    """A change at a round's start: its first time is the new speed's, and stays."""
    rnd = random.Random(2)
    laws = laws_after([*settled(rnd), (100, 2030.0), (100, 1990.0), (100, 2000.0)])
    assert laws.changed == {"w"}
    assert [ms for _, _, ms, _ in laws.obs["w"].items] == [2030.0, 1990.0, 2000.0]


def test_only_a_change_found_on_one_time_is_stepped_as_slower_again() -> None:
    """One time eight times off may straddle the change (its round began at the old speed): it is
    stepped as that many times slower again (`jumps`). Two times 2.5-3x off that agree are the new
    speed: stepped on as they are (taken as slower again, the worker got 15 samples where the optimum
    gives it 33, and the next decision had to step again)."""
    rnd = random.Random(3)
    one = laws_after([*settled(rnd), (100, 8000.0)])
    assert one.changed == one.slowed == {"w"} and one.jumps["w"] == pytest.approx(8.0, rel=0.05)
    two = laws_after([*settled(rnd), (100, 3000.0), (100, 3020.0)])
    assert two.changed == two.slowed == {"w"} and two.jumps == {}


def test_the_settled_law_is_fitted_when_the_mark_moves_and_shared_with_the_decisions_test(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The settled law is fitted again only when the mark moves, once every SETTLE_EVERY pushes, and
    a decision's test of the same worker (another worker changed) judges its newest times against
    that same law, fitting nothing."""
    from ps.control.auto import worker_laws

    laws = laws_after(settled(random.Random(5)))
    fitted: list[int] = []
    law_of, prefix_law = worker_laws.law_of, worker_laws.prefix_law
    monkeypatch.setattr(worker_laws, "law_of", lambda items, *a: fitted.append(len(items)) or law_of(items, *a))
    monkeypatch.setattr(worker_laws, "prefix_law", lambda obs, count, *a: fitted.append(count) or prefix_law(obs, count, *a))
    moves = 0
    for _ in range(4 * SETTLE_EVERY):
        mark, before = laws.settled["w"], len(fitted)
        laws.record("w", 100, 1000.0, None)
        moved = laws.settled["w"] != mark
        moves += moved
        assert len(fitted) == before + moved
        assert not laws.forget_before_change("w", 2.5, 3)
        assert len(fitted) == before + moved
    assert moves == 4


@pytest.mark.parametrize("seed", range(4))
def test_a_decisions_test_of_a_worker_reads_what_its_push_found(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A decision tests every worker that did not change (change.ALONG_TESTS): the push before it put
    the worker's times to those tests in the same pass, so the decision tests no time again and finds
    what a test of its own would. Times of 10% noise, the newest four off the law by 15 to 35%: found by
    the decision's test and not, and by the push's own (skipped)."""
    from ps.control.auto import worker_laws

    rnd = random.Random(seed)
    outcomes = set()
    for step in range(21):
        drift = 0.15 + 0.01 * step
        laws = laws_after([(100, 1000.0 * (1 + rnd.gauss(0, 0.1 if k < 20 else 0.02) + (drift if k >= 20 else 0.0)))
                           for k in range(24)])
        if laws.changed:  # the push's own test found it: the decision has nothing to ask
            continue
        fresh = [change_start(laws.obs["w"].items, laws.settled["w"], 3, 0.1, sds, rounds) for sds, rounds in ALONG_TESTS]
        calls: list[object] = []
        monkeypatch.setattr(worker_laws, "change_start", lambda *a, **k: calls.append(a) or change_start(*a, **k))
        for (sds, rounds), start in zip(ALONG_TESTS, fresh, strict=True):
            outcomes.add(start is not None)
            assert laws.forget_before_change("w", sds, rounds) == (start is not None)
            if start is not None:
                break  # taken: the other test's answer was of the times before it
        assert calls == []
        monkeypatch.undo()
    assert outcomes == {True, False}


def test_the_finish_times_are_fitted_once_until_a_time_comes_in() -> None:
    """A decision asks for every worker's finish time several times: they are the same mapping until
    a time is recorded, a worker changes speed, joins or leaves, or the state is read back; then they
    are those of the observations now, as laws made afresh from them have them."""
    from ps.control.auto.state import auto_part, read_auto_part
    from ps.control.model.parking import ParkingSchedule
    from ps.control.model.rounds import RoundLog

    rnd = random.Random(7)
    laws = laws_after(settled(rnd))
    first = laws.finishes()
    law = laws.law("w")
    assert law is not None and laws.finishes() is first and dict(first) == {"w": law.fit.finish}
    with pytest.raises(TypeError):
        first["x"] = first["w"]  # type: ignore[index]
    laws.record("w", 120, 1190.0, None)
    assert laws.finishes() is not first
    again = laws_after(settled(random.Random(7)) + [(120, 1190.0)])
    assert laws.finishes() == again.finishes()
    laws.add("v")
    assert set(laws.finishes()) == {"w"}  # v is not measured yet
    laws.remove("v")
    slower = laws.finishes()
    other = laws_after([(100, 1500.0 * (1 + rnd.gauss(0.0, 0.02))) for _ in range(20)])
    state = auto_part(other, ParkingSchedule(), RoundLog(), False, False)
    read_auto_part(state, {"w": 100}, laws)
    assert laws.finishes() is not slower and laws.finishes() == other.finishes()


@pytest.mark.parametrize("seed", range(10))
def test_the_choices_kept_between_refits_are_those_made_afresh(seed: int) -> None:
    """A refit keeps each worker's choice of batch sizes while its counts, its newest batch size and
    admitted batch stay (WorkerLaws._choice): along pushes that move between batch sizes, fill and
    overflow them and admit one, every choice a refit takes is law.choice of the observations now."""
    from ps.control.auto.law import choice

    rnd = random.Random(seed)
    laws = WorkerLaws(3, 0.1)
    laws.add("w")
    taken = []
    original = laws._choice

    def checked(worker_id: str, obs: Observations, admitted: int | None) -> Choice | None:
        picked = original(worker_id, obs, admitted)
        assert picked == (choice(obs.items, obs.counts, 3, admitted) if obs.items else None)
        taken.append(picked)
        return picked

    laws._choice = checked  # type: ignore[method-assign]
    batch = 50
    for _ in range(400):
        if rnd.random() < 0.15:
            batch = rnd.choice([10, 20, 24, 50, 51, 80, 90, 120, 200])
        if rnd.random() < 0.05:
            laws.admitted["w"] = rnd.choice([batch, 10, 200])
        elif rnd.random() < 0.05:
            laws.admitted.pop("w", None)
        laws.record("w", batch, batch * 10.0 * (1 + rnd.gauss(0.0, 0.02)) + 50.0, None)
        laws.finishes()
    assert len(taken) > 300


def reference_error(runs: list[list[float]]) -> float:
    """The largest relative standard error of a mean, from statistics alone."""
    return max((statistics.stdev(t) / statistics.fmean(t) / len(t) ** 0.5 for t in runs if len(t) > 1), default=0.0)


@pytest.mark.parametrize("seed", range(20))
def test_the_largest_error_is_the_exact_one_whatever_the_runs_lengths(seed: int) -> None:
    rnd = random.Random(seed)
    runs = [[rnd.choice([100.0, 1e-3, 3e5]) * (1 + rnd.gauss(0.0, rnd.choice([0.0, 1e-12, 0.05])))
             for _ in range(rnd.randint(2, 12))] for _ in range(rnd.randint(1, 80))]
    runs += [list(runs[0])] * rnd.randint(0, 3)  # ties
    assert largest_error(runs) == reference_error(runs)  # bit for bit


def test_the_time_error_of_a_plan_is_that_of_its_times_in_force() -> None:
    laws = WorkerLaws(min_samples=3, deadband=0.1)
    rnd = random.Random(0)
    for k, batch in (("a", 10), ("b", 20), ("c", 0)):
        laws.add(k)
        for _ in range(WARMUP + 6):
            laws.record(k, batch or 5, 100.0 * (1 + rnd.gauss(0.0, 0.05)), None)
    plan = {"a": 10, "b": 20, "c": 0}
    in_force = laws.in_force(plan)
    assert in_force is not None and set(in_force) == {"a", "b"}
    assert laws.time_error(plan) == laws.time_error(plan, in_force) == reference_error(list(in_force.values())) > 0
    assert largest_error([]) == 0.0


def test_the_times_in_force_at_least_one_take_however_few_each_worker_has_at_its_batch() -> None:
    laws = WorkerLaws(min_samples=3, deadband=0.1)
    for k in ("a", "b", "c"):
        laws.add(k)
        for _ in range(WARMUP):
            laws.record(k, 8, 1.0, None)
    for ms in (10.0, 12.0, 14.0):
        laws.record("a", 8, ms, None)
    laws.record("b", 4, 30.0, None)
    laws.record("b", 8, 20.0, None)  # its batch in the plan since this one time
    assert laws.in_force({"a": 8, "b": 8}) is None
    assert laws.in_force({"a": 8, "b": 8, "c": 0}, least=1) == {"a": [10.0, 12.0, 14.0], "b": [20.0]}
    assert laws.in_force({"a": 8, "b": 4}, least=1) is None  # b has no time since it got 4


def test_a_change_keeps_the_shape_of_a_known_law_and_only_of_one() -> None:
    """A law known at 50 and 100 samples (t = 8·b + 200 ms: 25 samples' worth of fixed cost) that
    changes speed keeps that fixed cost in samples as the shape of the law after the change; a law
    known only as a proportional line, or one with no fixed cost, keeps none (and forgets an older one)."""
    rnd = random.Random(4)
    known = [(b, (8.0 * b + 200.0) * (1 + rnd.gauss(0.0, 0.01))) for b in (50, 100) * 10]
    laws = laws_after([*known, (100, 2000.0), (100, 2010.0), (100, 1990.0)])
    assert laws.changed == {"w"} and laws.shapes["w"] == pytest.approx(25.0, rel=0.1)
    assert not laws_after([*settled(rnd), (100, 2010.0), (100, 1990.0), (100, 2000.0)]).shapes
    flat = [(b, 10.0 * b * (1 + rnd.gauss(0.0, 0.01))) for b in (50, 100) * 10]
    after = [(100, 2000.0 * (1 + rnd.gauss(0.0, 0.01))) for _ in range(12)]
    again = laws_after([*known, (100, 2000.0), (100, 2010.0), (100, 1990.0), *after[:9], *flat,
                        (100, 3000.0), (100, 3010.0), (100, 2990.0)])
    assert "w" not in again.shapes


@pytest.mark.parametrize("seed", range(3))
def test_a_settled_law_is_the_law_of_the_first_observations(seed: int) -> None:
    """law.prefix_law, which a push fits its worker's settled law by, is law_of of the first so many of
    the observations held, bit for bit, at every count: whatever batch sizes come and go, with exposed
    times or without, and with as many batch sizes as Observations drops the oldest of."""
    from ps.control.auto.law import law_of, prefix_law

    rnd = random.Random(seed)
    obs = Observations()
    sizes = [rnd.randint(1, 200) for _ in range(12)]
    batch = sizes[0]
    for step in range(150):
        if rnd.random() < 0.15:
            batch = rnd.choice(sizes)
        obs.add(batch, batch * rnd.uniform(0.4, 0.6) + rnd.uniform(5, 15), None if rnd.random() < 0.8 else rnd.uniform(0, 3))
        if step % 10 == 0:
            for count in range(len(obs.items) + 1):
                for min_samples in (1, 3):
                    assert repr(prefix_law(obs, count, min_samples)) == repr(law_of(obs.items[:count], min_samples))

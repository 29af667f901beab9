"""ps.control.model.time_fits: many workers' fits at once are time_fit.fit_of's, worker by worker,
whatever the observations (exposed or not, outliers, one batch size, none), and Observations keeps
the counts by batch size the fits read (pure)."""

from __future__ import annotations

import math
import random

import pytest

from ps.control.auto.law import law_of, laws_of
from ps.control.model.observations import MAX_BATCHES, PER_BATCH, Observations, fit_each
from ps.control.model.time_fit import Fit, fit_of
from ps.control.model.time_fits import fits_of

Item = tuple[int, int, float, float | None]


def observations(rnd: random.Random) -> list[Item]:
    """A worker's observations as Observations holds them: a line with noise, a few outliers, a few
    batch sizes, times exposed or not (or some of each)."""
    q, s = rnd.uniform(0.05, 3.0), rnd.choice([0.0, rnd.uniform(0.0, 80.0)])
    batches = rnd.sample(range(1, 200), rnd.randint(1, 4))
    exposure = rnd.choice(["none", "all", "some"])
    obs = Observations()
    for _ in range(rnd.randint(0, 40)):
        b = rnd.choice(batches)
        ms = (q * b + s) * (1.0 + rnd.gauss(0.0, 0.05)) * (rnd.choice([1.0] * 9 + [3.0]))
        exposed = None if exposure == "none" or (exposure == "some" and rnd.random() < 0.5) else rnd.uniform(0, 20)
        obs.add(b, max(ms, 0.01), exposed)
    return obs.items


def same(a: Fit | None, b: Fit | None) -> bool:
    if a is None or b is None:
        return a is b
    if a.batches != b.batches or (a.finish.exposed is None) != (b.finish.exposed is None):
        return False
    pairs = list(zip(a.line, b.line)) + [(a.finish.floor, b.finish.floor)]
    if a.finish.exposed is not None and b.finish.exposed is not None:
        pairs += list(zip(a.finish.exposed, b.finish.exposed))
    return all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12) for x, y in pairs)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("min_samples", [1, 3])
def test_the_fits_at_once_are_each_workers_own_fit(seed: int, min_samples: int) -> None:
    rnd = random.Random(seed)
    lists = [observations(rnd) for _ in range(200)]
    for items, fit in zip(lists, fits_of(lists, min_samples), strict=True):
        assert same(fit, fit_of(items, min_samples)), items


def test_no_observations_fit_nothing() -> None:
    assert fits_of([], 3) == []
    assert fits_of([[], []], 3) == [None, None]
    one = [(0, 8, 16.0, None)]
    assert fits_of([[], one, []], 1) == [None, fit_of(one, 1), None]


@pytest.mark.parametrize("seed", range(4))
def test_laws_at_once_are_each_workers_own_law(seed: int) -> None:
    rnd = random.Random(seed)
    requests = []
    for _ in range(100):
        obs = Observations()
        for seq, b, ms, e in observations(rnd):
            obs.add(b, ms, e)
        admitted = rnd.choice([None, obs.items[-1][1] if obs.items else None, rnd.randint(1, 300)])
        requests.append((obs, admitted))
    for (obs, admitted), law in zip(requests, laws_of(requests, 3), strict=True):
        alone = law_of(obs.items, 3, admitted)
        assert (law is None) == (alone is None)
        if law is not None and alone is not None:
            assert (law.known, law.batch) == (alone.known, alone.batch)
            assert same(law.fit, alone.fit)


def test_fits_made_at_once_are_kept_as_each_workers_own_and_kept_ones_are_not_made_again() -> None:
    rnd = random.Random(5)
    held = []
    for _ in range(50):
        obs = Observations()
        for _, b, ms, e in observations(rnd):
            obs.add(b, ms, e)
        held.append(obs)
    excludes = [rnd.randint(0, 5) for _ in held]
    kept = held[0].fit(3, excludes[0])
    fit_each(held, 3, excludes)
    fit_each(held, 3)
    assert held[0].fit(3, excludes[0]) is kept
    for obs, n in zip(held, excludes, strict=True):
        for exclude in {0, n}:
            alone = fit_of(obs.items[: len(obs.items) - exclude], 3)
            assert same(obs.fit(3, exclude), alone)


def test_the_counts_by_batch_size_are_those_of_the_items_held() -> None:
    rnd = random.Random(0)
    obs = Observations()
    for _ in range(600):
        obs.add(rnd.randint(1, 2 * MAX_BATCHES), rnd.uniform(1.0, 50.0), None)
        counts: dict[int, int] = {}
        for _, b, _, _ in obs.items:
            counts[b] = counts.get(b, 0) + 1
        assert obs.counts == counts
        assert len(counts) <= MAX_BATCHES and max(counts.values()) <= PER_BATCH
    obs.rescale(0.5, 3)
    assert sum(obs.counts.values()) == len(obs.items)
    # built from more items than it keeps: the counts are those of the items it kept
    many = [(seq, rnd.randint(1, 2 * MAX_BATCHES), 1.0, None) for seq in range(400)]
    built = Observations(many)
    assert len(built.items) < len(many)
    assert built.counts == {b: sum(1 for it in built.items if it[1] == b) for b in {it[1] for it in built.items}}

"""ps.control.model.item_rows: an Observations' rows are its items, field by field and in order, after
every way its items change (a push, a batch size's oldest time pushed out, the oldest batch size
dropped, a rescale, a new Observations), and many workers' fits from the rows are the fits from the
tuples bit for bit (pure)."""

from __future__ import annotations

import math
import random

import numpy as np

from ps.control.model.item_rows import ItemRows, joined
from ps.control.model.observations import MAX_BATCHES, PER_BATCH, Observations
from ps.control.model.time_fits import fits_of, fits_of_rows

Item = tuple[int, int, float, float | None]


def as_rows(items: list[Item]) -> list[tuple[float, float, float, float]]:
    return [(float(seq), float(b), ms, math.nan if e is None else e) for seq, b, ms, e in items]


def held(obs: Observations) -> bool:
    """Whether the rows are the items, NaN where an item's exposed time is None."""
    rows = obs.rows.rows()
    return len(rows) == len(obs.items) and np.array_equal(rows, np.array(as_rows(obs.items)).reshape(-1, 4),
                                                          equal_nan=True)


def test_rows_follow_every_change_of_the_items() -> None:
    rnd = random.Random(7)
    obs = Observations()
    assert held(obs) and len(obs.rows) == 0
    for step in range(600):
        batch = rnd.choice(range(1, MAX_BATCHES + 4)) if step % 50 < 10 else rnd.choice([8, 16])
        obs.add(batch, rnd.uniform(1.0, 50.0), None if rnd.random() < 0.5 else rnd.uniform(0.0, 5.0))
        assert held(obs), step
        assert max(obs.counts.values()) <= PER_BATCH and len(obs.counts) <= MAX_BATCHES
        if step % 97 == 96:
            obs.rescale(rnd.uniform(0.5, 2.0), rnd.randint(1, 4))
            assert held(obs), step
    again = Observations(obs.items, obs.seq)
    assert held(again)


def test_rows_grow_past_their_first_size_and_drop_from_the_middle() -> None:
    rows = ItemRows()
    items: list[Item] = [(i, 4, float(i), None) for i in range(100)]
    for item in items:
        rows.append(item)
    rows.delete(50)
    del items[50]
    assert np.array_equal(rows.rows(), np.array(as_rows(items)), equal_nan=True)
    for count in (-200, -3, 0, 5, 99, 200):
        assert np.array_equal(rows.rows(count), np.array(as_rows(items[:count])).reshape(-1, 4), equal_nan=True)
    assert np.array_equal(joined([rows, rows], [2, -97]), np.array(as_rows(items[:2] + items[:-97])), equal_nan=True)
    rows.reset([])
    assert len(rows) == 0 and rows.rows().shape == (0, 4) and joined([]).shape == (0, 4)


def test_fits_from_rows_are_the_fits_from_tuples_bit_for_bit() -> None:
    rnd = random.Random(3)
    workers = []
    for _ in range(40):
        obs = Observations()
        for _ in range(rnd.randint(0, 40)):
            b = rnd.choice([4, 9, 30])
            obs.add(b, (0.5 * b + 10.0) * rnd.uniform(0.8, 1.6), None if rnd.random() < 0.3 else rnd.uniform(0, 3))
        workers.append(obs)
    blocks = [obs.rows.rows() for obs in workers]
    counts = np.array([len(block) for block in blocks], dtype=np.int64)
    assert fits_of_rows(counts, np.concatenate(blocks), 3) == fits_of([obs.items for obs in workers], 3)

"""What a worker name's earlier joins earn its next one (ps/rounds/rejoins.py): the warm-up bound once
per name; rejoins after departures without a push back off, doubling to a cap, and a push clears them;
a push taken proves the name (no probation when it is back)."""

from __future__ import annotations

import pytest

from common.errors import ResourceExhausted
from ps.rounds.rejoins import Rejoins


def test_the_warm_up_bound_comes_with_a_names_first_entry_only() -> None:
    names = Rejoins()
    assert names.entered("a") is True
    assert names.entered("a") is False  # back after an eviction: no second warm-up
    assert names.entered("b") is True


def test_rejoins_without_a_push_back_off_doubling_to_the_cap_and_a_push_clears_them() -> None:
    names = Rejoins(backoff_s=1.0, max_backoff_s=4.0)
    names.check("x", 0.0)  # a name never seen joins at once
    waits = [names.departed("x", pushed=False, now=10.0 * i) for i in range(1, 5)]
    assert waits == [1.0, 2.0, 4.0, 4.0]
    with pytest.raises(ResourceExhausted, match=r"'x' left or was evicted 4 time\(s\) in a row without a push: "
                                                r"join again in 2.5 s"):
        names.check("x", 41.5)
    names.check("x", 44.0)
    names.check("y", 41.5)  # another name is not held back
    assert names.refused == 1
    assert names.departed("x", pushed=True, now=50.0) == 0.0
    names.check("x", 50.0)
    assert names.departed("x", pushed=False, now=60.0) == 1.0  # the doubling starts again


def test_the_record_keeps_the_names_seen_last() -> None:
    names = Rejoins(max_names=2)
    names.departed("old", pushed=False, now=0.0)
    names.entered("mid")
    names.entered("new")
    names.check("old", 0.5)  # forgotten: it joins as a new name
    assert names.entered("old") is True


def test_a_name_is_proven_by_a_push_taken_and_stays_so() -> None:
    names = Rejoins()
    names.entered("a")
    assert not names.proven("a") and not names.proven("never")
    names.departed("a", pushed=False, now=0.0)
    assert not names.proven("a")  # left without a push: on probation when back
    names.proved("a")  # its probe was taken
    assert names.proven("a")
    names.departed("a", pushed=False, now=1.0)
    assert names.proven("a")
    names.departed("b", pushed=True, now=1.0)  # a push a round counted
    assert names.proven("b")

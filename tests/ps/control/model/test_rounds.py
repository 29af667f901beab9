"""ps.control.model.rounds: a round's overhead c is taken when c is read, against the fits then, and
before a worker's fit jumps, against the fits before the jump."""

from __future__ import annotations

import random
from collections.abc import Mapping

from ps.control.config import PolicyConfig
from ps.control.model.rounds import OVERHEAD_ROUNDS, RoundLog, WorkerSetRounds
from ps.control.model.time_fit import Finish, Line
from ps.control.policy import build_policy


class Fits:
    """A finishes() source that counts how often it is asked."""

    def __init__(self, finishes: Mapping[str, Finish]) -> None:
        self.finishes = dict(finishes)
        self.asked = 0

    def __call__(self) -> Mapping[str, Finish]:
        self.asked += 1
        return self.finishes


def closed(log: RoundLog, fits: Fits, rounds: list[tuple[float, dict[str, int]]]) -> None:
    for round_ms, pushed in rounds:
        for k, b in pushed.items():
            log.push(k, b)
        log.close(round_ms, fits)


def test_c_is_taken_when_read_against_the_fits_then_and_only_once() -> None:
    fits = Fits({"a": Finish(Line(1.0, 0.0)), "b": Finish(Line(2.0, 0.0))})
    log = RoundLog()
    closed(log, fits, [(25.0, {"a": 10, "b": 10}), (31.0, {"a": 10, "b": 12}), (5.0, {"c": 3})])
    assert fits.asked == 0 and log.measured == [25.0, 31.0, 5.0]
    fits.finishes["b"] = Finish(Line(2.5, 0.0))  # the fits move before c is read: c is taken against these
    assert list(log.overhead) == [0.0, 1.0]  # max(0, 25 - 25), 31 - 30; the round of c (no fit) does not count
    assert log.overhead_ms == 0.5 and fits.asked == 1
    closed(log, fits, [(40.0, {"a": 10})])
    assert log.overhead_ms == 1.0 and fits.asked == 2


def test_only_the_recent_rounds_wait_and_a_set_keeps_its_own() -> None:
    fits = Fits({"a": Finish(Line(1.0, 0.0)), "b": Finish(Line(1.0, 0.0))})
    log = WorkerSetRounds()
    closed(log, fits, [(12.0 + r % 3, {"a": 10}) for r in range(2 * OVERHEAD_ROUNDS)] + [(20.0, {"a": 10, "b": 10})] * 3)
    assert len(log.overhead) == OVERHEAD_ROUNDS and fits.asked == 1
    assert log.overhead_for({"a": 10, "b": 10}) == 10.0 and log.overhead_for({"a": 10, "b": 0}) == 3.0


def test_rounds_before_a_change_of_speed_keep_their_c() -> None:
    """A worker becomes four times slower: the rounds before the change are taken against the law
    before it, so c stays the server's 2 ms, not 0 (each old round against the new, slower law)."""
    rnd = random.Random(0)
    ctl = build_policy(PolicyConfig(policy="auto", global_batch=64))
    speeds = {"a": 1.0, "b": 1.0}
    for k in speeds:
        ctl.add_worker(k)
    ctl.replan()
    for r in range(40):
        if r == 30:
            speeds["a"] = 4.0
        times = []
        for k, b in ctl.plan().items():
            if b > 0:
                t = speeds[k] * (0.5 * b + 3.0) * (1 + rnd.gauss(0.0, 0.01))
                ctl.observe(k, b, t)
                times.append(t)
        ctl.observe_round(max(times) + 2.0)
    ctl.adjust()  # the first decision: its c is that of the last OVERHEAD_ROUNDS rounds, the change's
    assert abs(ctl.report()["overhead_ms"] - 2.0) < 0.5

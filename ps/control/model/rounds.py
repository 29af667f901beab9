"""The BSP rounds as the model and auto policies measure them: each round's overhead c (its time on the
server's clock past the slowest fitted finish of the batches pushed in it: what the server and the
wire add, and the excess of the slowest of several noisy finishes, so that predictions of whole rounds
are not biased low), the rounds of the plan in force, and the round that plan was predicted to take,
so that each decision reports how far its prediction was off. The model policy keeps c per set of
workers in the round too (`WorkerSetRounds`).

A round's c is taken against the fits as they are when c is next read (the decision that predicts
with them), or just before a worker's fit jumps (a change of speed forgets its older times), not at
the round's close: fitting every worker's law again after every round was two fifths of the auto
policy's CPU at a thousand workers (docs/scaling.md). Pure."""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from ps.control.model.time_fit import Finish

OVERHEAD_ROUNDS = 32
"""Rounds whose overhead the median of c is taken over."""
MEASURED_ROUNDS = 256
"""Round times of the plan in force kept for its measured median."""
MIN_ERROR_ROUNDS = 3
"""Rounds of a plan that its prediction error is taken from."""


class RoundLog:
    """The overheads of the recent rounds, the batches pushed in the open one and the round times of
    the plan in force, with that plan's predicted round."""

    def __init__(self, overhead: list[float] | None = None, measured: list[float] | None = None,
                 predicted: float | None = None) -> None:
        self._overhead: deque[float] = deque(overhead or (), maxlen=OVERHEAD_ROUNDS)
        self.measured: list[float] = list(measured or ())[-MEASURED_ROUNDS:]
        self.predicted = predicted
        self.pushed: dict[str, int] = {}
        # the closed rounds whose c is not taken yet, and where the fits to take it against come from
        self._pending: deque[tuple[float, dict[str, int]]] = deque(maxlen=OVERHEAD_ROUNDS)
        self._finishes: Callable[[], Mapping[str, Finish]] | None = None
        # the server's CPU a push of the recent rounds (in memory only: a resumed policy measures it again)
        self._push: deque[float] = deque(maxlen=OVERHEAD_ROUNDS)
        self._push_rounds: deque[float] = deque(maxlen=OVERHEAD_ROUNDS)  # those rounds' times

    def push(self, worker_id: str, batch: int) -> None:
        """A worker's batch went into the open round."""
        self.pushed[worker_id] = batch

    def close(self, round_ms: float, finishes: Callable[[], Mapping[str, Finish]], push_ms: float = 0.0) -> None:
        """The round closed after `round_ms`; its c is taken when c is next read, against `finishes()`
        then, and counts where every batch in it has a fit. `push_ms`: the server's CPU a push in it
        (0: not measured)."""
        if push_ms > 0.0:
            self._push.append(push_ms)
            self._push_rounds.append(round_ms)
        if self.pushed:
            self._pending.append((round_ms, self.pushed))
            self._finishes = finishes
        self.measured = [*self.measured[-(MEASURED_ROUNDS - 1):], round_ms]
        self.pushed = {}

    def _take(self, round_ms: float, pushed: Mapping[str, int], finishes: Mapping[str, Finish]) -> float | None:
        """One closed round's c (None: one of its batches has no fit), kept among the recent ones."""
        if not finishes.keys() >= pushed.keys():
            return None
        # every pushed batch's finish, by calls without a frame of their own (thousands a round)
        c = max(0.0, round_ms - max(map(Finish.at, map(finishes.__getitem__, pushed), pushed.values())))
        self._overhead.append(c)
        return c

    def settle(self) -> None:
        """Take the c of the rounds closed since it was last read (also before a worker's fit jumps:
        worker_times.WorkerTimes.before_jump)."""
        if self._pending and self._finishes is not None:
            finishes = self._finishes()
            for round_ms, pushed in self._pending:
                self._take(round_ms, pushed, finishes)
        self._pending.clear()

    @property
    def overhead(self) -> deque[float]:
        """The c of the recent rounds that counted, oldest first."""
        self.settle()
        return self._overhead

    @property
    def overhead_ms(self) -> float:
        """c, the median overhead of the recent rounds (0 before any)."""
        overhead = self.overhead
        return statistics.median(overhead) if overhead else 0.0

    def push_ms(self) -> tuple[float, float]:
        """The server's CPU a push and the round, medians of the recent rounds that measured it (0, 0
        before any)."""
        if not self._push:
            return 0.0, 0.0
        return statistics.median(self._push), statistics.median(self._push_rounds)

    def closing(self) -> dict[str, Any]:
        """The plan in force until now, for a decision's report: its predicted and its measured median
        round; the measurements start again for the next plan."""
        measured = statistics.median(self.measured) if self.measured else None
        out = {"predicted_round_ms": _round(self.predicted), "measured_round_ms": _round(measured),
               "rounds": len(self.measured)}
        self.measured = []
        return out


class WorkerSetRounds(RoundLog):
    """The rounds, and c per set of workers in the round: a re-probed worker adds a slow, noisy finish
    whose excess c must not carry over to the rounds without it. The per-set values live in memory
    only: a resumed policy starts from the whole window."""

    def __init__(self, overhead: list[float] | None = None, measured: list[float] | None = None,
                 predicted: float | None = None) -> None:
        super().__init__(overhead, measured, predicted)
        self.overhead_of: dict[frozenset[str], deque[float]] = {}

    def _take(self, round_ms: float, pushed: Mapping[str, int], finishes: Mapping[str, Finish]) -> float | None:
        c = super()._take(round_ms, pushed, finishes)
        if c is not None:
            self.overhead_of.setdefault(frozenset(pushed), deque(maxlen=OVERHEAD_ROUNDS)).append(c)
        return c

    def overhead_for(self, plan: Mapping[str, int]) -> float:
        """c for the workers `plan` puts in the round: the median over the recent rounds of that set
        once it has MIN_ERROR_ROUNDS of them, else over every recent round (0 before any)."""
        overhead = self.overhead  # the pending rounds taken first
        own = self.overhead_of.get(frozenset(k for k, b in plan.items() if b > 0), ())
        values = own if len(own) >= MIN_ERROR_ROUNDS else overhead
        return statistics.median(values) if values else 0.0


def prediction_error(previous: Mapping[str, Any]) -> float:
    """The relative error of a plan's predicted round against its measured median (`closing`; 0 when
    either is missing, or fewer than MIN_ERROR_ROUNDS rounds measured it)."""
    predicted, measured = previous.get("predicted_round_ms"), previous.get("measured_round_ms")
    if not predicted or not measured or previous.get("rounds", 0) < MIN_ERROR_ROUNDS:
        return 0.0
    return float(abs(predicted - measured) / measured)


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)

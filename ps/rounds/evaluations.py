"""Test-split evaluations of the global model at epoch ends (and, with --eval-every 1/K, at each K-th
of an epoch's samples): submitted to the background evaluator once the whole model is here
(ps/rounds/whole_model.py), their results kept and logged (`eval`)."""

from __future__ import annotations

import functools

from ps.rounds.evaluator import BackgroundEvaluator
from ps.rounds.epochs import Epochs
from ps.rounds.state import JobState
from ps.rounds.whole_model import WholeModel


class Evaluations:
    """The evaluator (None: no evaluations) and what it found."""

    def __init__(self, state: JobState, evaluator: BackgroundEvaluator | None, epochs: Epochs,
                 whole_model: WholeModel) -> None:
        self.state = state
        self.evaluator = evaluator
        self.epochs = epochs
        self.whole_model = whole_model
        self.last_accuracy: float | None = None
        self.last_loss: float | None = None
        self.results: list[tuple[float, float, float, float]] = []  # (epoch, accuracy, loss, wall_s)
        self._within = (0, 0)  # (epoch, how many of its K-ths were evaluated)

    def drained(self) -> None:
        """The evaluator finished every evaluation submitted: the last epoch's is the job's (the summary's)."""
        if self.results:
            self.last_accuracy = self.results[-1][1]

    def due(self, epoch: int) -> bool:
        """Whether `epoch`'s end is evaluated: every `evaluator.every`-th epoch's, and the last's."""
        return self.evaluator is not None and (epoch % self.evaluator.every == 0 or epoch >= self.state.spec.epochs)

    def within_epoch(self, done: float) -> float | None:
        """With --eval-every 1/K: the point of the epoch in progress to evaluate now (the epochs
        trained, e.g. 2.25), where `done` (the fraction of its samples trained) passed its next K-th
        short of the end; else None. One evaluation a round at most: the newest K-th passed."""
        per_epoch = self.evaluator.per_epoch if self.evaluator is not None else 1
        epoch = self.state.epoch
        taken = self._within[1] if self._within[0] == epoch else 0
        passed = min(per_epoch - 1, int(done * per_epoch))
        if passed <= taken:
            return None
        self._within = (epoch, passed)
        return round(epoch + passed / per_epoch, 4)

    def submit(self, epoch: float, wall: float | None = None) -> None:
        """Evaluate the model as it is after `epoch` epochs (`wall`: seconds into the job)."""
        if self.evaluator is None:
            return
        s = self.state
        wall = s.clock() - (self.epochs.start_time or s.clock()) if wall is None else wall
        if self.whole_model.defer(functools.partial(self.submit, epoch, wall)):
            return
        snapshot = self.whole_model.params()

        def done(accuracy: float, loss: float) -> None:
            self.last_accuracy, self.last_loss = accuracy, loss
            self.results.append((epoch, accuracy, loss, wall))
            bn = self.evaluator.last_bn_stats if self.evaluator is not None else None
            s.metrics.write("eval", epoch=epoch, accuracy=round(accuracy, 5), loss=round(loss, 5), wall_s=round(wall, 3),
                            **({"bn": bn} if bn is not None else {}))

        self.evaluator.submit(snapshot, done)

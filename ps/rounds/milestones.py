"""What falls due as the steps are counted, in order: the epoch's end (its evaluation, the learning rate
of the next, the job's end after the last, --adaptive-batch's decision), the batch policy's decisions
and the checkpoints, every N steps or at every epoch's end (ps.rounds.epochs keeps the counts)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from common.job.endings import FINISHED
from ps.rounds.adaptive_batch import AdaptiveBatchSizing
from ps.rounds.epochs import Epochs
from ps.rounds.evaluations import Evaluations
from ps.rounds.path_trial import PathTrial
from ps.rounds.state import JobState
from ps.rounds.whole_model import WholeModel


class Milestones:
    """Runs what a step makes due; `on_checkpoint(state, step)` writes the checkpoint `checkpoint_state()` gives."""

    def __init__(self, state: JobState, epochs: Epochs, evaluation: Evaluations, adaptive: AdaptiveBatchSizing,
                 path_trial: PathTrial, whole_model: WholeModel,
                 on_checkpoint: Callable[[dict[str, Any], int], None] | None,
                 checkpoint_state: Callable[[], dict[str, Any]]) -> None:
        self.state = state
        self.epochs = epochs
        self.evaluation = evaluation
        self.adaptive = adaptive
        self.path_trial = path_trial
        self.whole_model = whole_model
        self.on_checkpoint = on_checkpoint
        self.checkpoint_state = checkpoint_state

    def advance(self, batch: int) -> None:
        """A step of `batch` samples: count them; run epoch ends, step-based policy decisions and checkpoints."""
        s = self.state
        self.epochs.count(batch)
        along = False
        while not s.done and self.epochs.epoch_over():
            self._end_epoch(along)
            along = True  # a second epoch ending at this step trained alongside the first
        if s.done:
            return
        within = self.evaluation.within_epoch(self.epochs.fraction_done())
        if within is not None:
            self.evaluation.submit(within)
        self.adaptive.after_round()  # before the policy's decision resets the times it measured
        if self.epochs.adjust_due() and not self.path_trial.holds_plan:  # the trial times both paths at one plan
            self.path_trial.decided(changed=self.epochs.adjust())
        if self.epochs.checkpoint_due():
            self.checkpoint()

    def _end_epoch(self, along: bool) -> None:
        s = self.state
        self.epochs.end_epoch(along)
        if self.evaluation.due(s.epoch):
            self.evaluation.submit(s.epoch)
        s.store.set_lr(self.adaptive.lr_at(s.epoch))
        if s.epoch >= s.spec.epochs:
            s.finish(FINISHED)
            return
        self.adaptive.at_epoch_end()
        if self.epochs.adjust_every is None and not self.path_trial.holds_plan:
            self.path_trial.decided(changed=self.epochs.adjust())
        if self.epochs.checkpoint_every is None:
            self.checkpoint()

    def checkpoint(self) -> None:
        """Checkpoint now, or once the whole model is here (ps.rounds.whole_model)."""
        self.epochs.checkpointed()
        if self.on_checkpoint is not None and not self.whole_model.defer(self._save):
            self._save()

    def _save(self) -> None:
        if self.on_checkpoint is not None:
            self.on_checkpoint(self.checkpoint_state(), self.state.step)

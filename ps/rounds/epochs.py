"""Epochs and the step counts that schedule decisions: the samples trained on against the training
set, an epoch's end and its `epoch` record, the steps after which the batch policy decides (`adjust`)
and a checkpoint is due (every N steps, or at every epoch end), and the job's start and end times."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ps.rounds.membership import Member
from ps.rounds.ssp import epoch_fields
from ps.rounds.state import JobState


class Epochs:
    """Counts steps and samples; the coordinator asks what is due and runs it."""

    def __init__(self, state: JobState, samples_per_epoch: int, adjust_every: int | None,
                 checkpoint_every: int | None, completed: Callable[[], int | None] = lambda: None) -> None:
        """`completed`: the epochs wholly trained, where the samples handed out say it (--sampling exact);
        None: an epoch is over when the samples trained reach its end."""
        self.state = state
        self.completed = completed
        self.samples_per_epoch = samples_per_epoch
        self.adjust_every = adjust_every  # None: at every epoch end
        self.checkpoint_every = checkpoint_every  # None: at every epoch end
        self.start_time: float | None = None
        self.end_time: float | None = None
        self.epoch_start_time: float | None = None
        self.epoch_start_samples = 0
        self.start_samples = 0  # the samples trained before this run's start (a resume's)
        self.steps_since_adjust = 0
        self.steps_since_checkpoint = 0
        self._first_round_logged = False
        self._last_record: dict[str, Any] | None = None  # the last `epoch` record's fields (`end_epoch`'s along)

    def start(self, now: float) -> None:
        """The job (and its first epoch here) starts at `now`, with the samples a resumed checkpoint had
        trained already counted (`start_samples`: the summary's throughput is this run's alone)."""
        self.start_time = self.epoch_start_time = now
        self.start_samples = self.state.samples

    def resumed(self, samples: int) -> None:
        """Before the start: a checkpoint's epoch had trained `samples` when it was written."""
        self.epoch_start_samples = samples

    def ended(self, reason: str) -> None:
        """The job is done (RoundEvents.ended)."""
        self.end_time = self.state.clock()

    def checkpointed(self) -> None:
        """A checkpoint was taken (or handed to whatever it waits for): the next is due N steps on."""
        self.steps_since_checkpoint = 0

    def count(self, batch: int) -> None:
        """One step (a BSP round, an ASP update) of `batch` samples."""
        s = self.state
        s.count_samples(batch)
        s.metrics.sample("step", step=s.step, batch=batch)
        self.steps_since_adjust += 1
        self.steps_since_checkpoint += 1

    def count_push(self, member: Member, ms: float | None, batch: int, exposed_ms: float = 0.0,
                   data_wait_ms: float = 0.0) -> None:
        """A push's sample for the metrics; the member's updates, compute, exposed and data-wait times this
        epoch (`exposed_ms` 0: not measured; `data_wait_ms`: of the compute time, the wait for the batch)."""
        self.state.metrics.sample("push", worker=member.name, batch=batch, ms=ms, exposed_ms=exposed_ms,
                                  data_wait_ms=data_wait_ms)
        member.count_push(ms, exposed_ms, data_wait_ms)

    def fraction_done(self) -> float:
        """The fraction of the epoch in progress trained so far (its samples over the epoch's)."""
        return (self.state.samples - self.epoch_start_samples) / self.samples_per_epoch if self.samples_per_epoch else 0.0

    def epoch_over(self) -> bool:
        """Whether the current epoch is over: all its samples reached the model (--sampling exact), or
        the samples trained reach its end."""
        completed = self.completed()
        if completed is not None:
            return completed > self.state.epoch
        return self.state.samples >= (self.state.epoch + 1) * self.samples_per_epoch

    def adjust_due(self) -> bool:
        """--adjust-every N: N steps since the last decision (ASP: N updates per worker); or the policy
        asks for one now (a probe measured)."""
        per_worker = 1 if self.state.spec.mode == "bsp" else max(1, len(self.state.members))
        scheduled = self.adjust_every is not None and self.steps_since_adjust >= self.adjust_every * per_worker
        return scheduled or self.state.policy_calls.decision_due()

    def checkpoint_due(self) -> bool:
        """--checkpoint-every N: N steps since the last checkpoint."""
        return self.checkpoint_every is not None and self.steps_since_checkpoint >= self.checkpoint_every

    def end_epoch(self, along: bool = False) -> None:
        """Count the epoch and write its `epoch` record; the members' per-epoch counters start again.
        `along`: it ends at the same step as the epoch before it, whose samples trained alongside it
        (--sampling exact in ASP: a slow worker held that epoch's last samples while the others trained
        this one); its record is that epoch's figures, over the same time, with `with_epoch` naming it."""
        s = self.state
        now = s.clock()
        s.next_epoch()
        if along and self._last_record is not None:
            s.metrics.write("epoch", **{**self._last_record, "epoch": s.epoch, "with_epoch": self._last_record["epoch"]})
            return
        elapsed = now - (self.epoch_start_time or now)
        samples = s.samples - self.epoch_start_samples
        record = dict(
            epoch=s.epoch,
            step=s.step,
            wall_s=round(now - (self.start_time or now), 3),
            samples_per_s=round(samples / elapsed, 2) if elapsed > 0 else None,
            batch_sizes=s.policy.plan(),
            compute_ms={
                m.name: round(sum(m.epoch_compute_ms) / len(m.epoch_compute_ms), 3)
                for m in s.members.values()
                if m.epoch_compute_ms
            },
            updates={m.name: m.epoch_updates for m in s.members.values()},
            balance=s.spec.balance,
            **({"exposed_ms": exposed} if (exposed := {
                m.name: round(sum(m.epoch_exposed_ms) / len(m.epoch_exposed_ms), 3)
                for m in s.members.values() if m.epoch_exposed_ms}) else {}),
            data_wait_ms={m.name: round(sum(m.epoch_data_wait_ms) / len(m.epoch_data_wait_ms), 3)
                          for m in s.members.values() if m.epoch_data_wait_ms},
            **(epoch_fields({m.name: m.asp for m in s.members.values()}) if s.spec.mode == "asp" else {}),
        )
        s.metrics.write("epoch", **record)
        self._last_record = record
        for m in s.members.values():
            m.new_epoch()
        self.epoch_start_time, self.epoch_start_samples = now, s.samples

    def first_round(self) -> None:
        """The `first_round` record, once: every worker has built its data and model (after Join) and
        pushed once, so training proper begins."""
        if self._first_round_logged:
            return
        self._first_round_logged = True
        s = self.state
        s.metrics.write("first_round", step=s.step, epoch=s.epoch, wall_s=round(s.clock() - (self.start_time or s.clock()), 3))

    def adjust(self) -> bool:
        """One batch-policy decision, and its `adjust` record; whether it changed the plan."""
        policy = self.state.policy
        before, smoothed = policy.plan(), policy.smoothed_ms()
        after = self.state.policy_calls.adjust()
        self.steps_since_adjust = 0
        if after is None:  # the policy failed (its policy_error record says how): the plan in force stays
            return policy.plan() != before
        self.log_adjust(changed=after != before, smoothed=smoothed)
        return after != before

    def log_adjust(self, changed: bool, smoothed: dict[str, float | None] | None = None) -> None:
        """One `adjust` event: the plan after the decision and the smoothed times it was based on, with
        what the policy reports of it (the model policy: its fits and predicted round)."""
        s = self.state
        smoothed = s.policy.smoothed_ms() if smoothed is None else smoothed
        s.metrics.write(
            "adjust",
            step=s.step,
            epoch=s.epoch,
            batch_sizes=s.policy.plan(),
            compute_ms={name: round(t, 3) for name, t in smoothed.items() if t is not None},
            changed=changed,
            adjustments=s.policy.adjustments,
            **s.policy.report(),
        )

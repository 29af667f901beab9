"""A BSP push taken into the open round, and the round's close: once every member the plan gives a batch
pushed (or a removal left only pushes that are in), the round's sum is stepped here or, with --shards,
committed across the shard servers in the background; then the next round opens and what the step
made due runs (ps.rounds.milestones)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ps.rounds.admission import Admission
from ps.rounds.adaptive_batch import AdaptiveBatchSizing
from ps.rounds.bsp import BspRound
from ps.rounds.deadlines import Deadlines
from ps.rounds.epochs import Epochs
from ps.rounds.fast_path import FastPath
from ps.rounds.membership import Member
from ps.rounds.milestones import Milestones
from ps.rounds.path_trial import PathTrial
from ps.rounds.sampling import Sampling
from ps.rounds.state import JobState
from ps.rounds.whole_model import WholeModel
from ps.shards.client import ShardFailure
from common.transport.chunked import Vector
from common.transport.messages import PushMeta


class RoundClose:
    """The open round's pushes and its close, through the concerns each part belongs to."""

    def __init__(self, state: JobState, bsp: BspRound, sampling: Sampling, epochs: Epochs,
                 adaptive: AdaptiveBatchSizing, fast_path: FastPath, deadlines: Deadlines, path_trial: PathTrial,
                 whole_model: WholeModel, admission: Admission, milestones: Milestones,
                 stop: Callable[[str], None], commit_wait_s: float) -> None:
        """`stop` ends the job (a shard's commit failed); `commit_wait_s`: how long a shard waits for the
        round's pushes it has not had."""
        self.state = state
        self.bsp = bsp
        self.sampling = sampling
        self.epochs = epochs
        self.adaptive = adaptive
        self.fast_path = fast_path
        self.deadlines = deadlines
        self.path_trial = path_trial
        self.whole_model = whole_model
        self.admission = admission
        self.milestones = milestones
        self.stop = stop
        self.commit_wait_s = commit_wait_s

    async def push(self, member: Member, meta: PushMeta, grad: Vector) -> None:
        """Take a checked push into the open round; returns once the round closed."""
        s = self.state
        ms = self.bsp.balanced_ms(member, meta)
        if ms is not None:
            exposed = meta.times.fitted_exposed_ms(s.spec.balance)
            s.policy_calls.observe(member.name, meta.batch_size, ms, exposed_ms=exposed)
        self.bsp.add(member, meta, grad)
        self.sampling.pushed(member, meta.batch_size)
        self.adaptive.push(member.name, meta, grad)
        self.epochs.count_push(member, ms, meta.batch_size, meta.times.exposed_ms, meta.times.data_wait_ms)
        future = self.bsp.mark_pushed(member)
        if self.bsp.all_pushed():
            self.close()
        elif meta.kind == "report" and 0 < meta.generation < self.fast_path.generation():
            self.fast_path.note_close_without(self.bsp.pushed)  # this report's group took the step, and a removal
            self.close()  # has replaced it
        await asyncio.shield(future)

    def after_removal(self) -> None:
        """A member left or was evicted: close a round that only waited on it; with nobody planned left in
        the open round, the waiting workers and the probationers whose probe is in start it."""
        pushes = self.bsp.pushes()
        if pushes and self.bsp.all_pushed():
            self.close()  # its boundary admits the workers waiting to join
        elif pushes and self.state.rendezvous is not None:
            self.fast_path.note_close_without(self.bsp.pushed)  # every report here came from the generation this
            self.close()  # removal replaced: close before every member reported (FastPath.note_close_without)
        elif not self.state.planned():  # and the probationers whose probe is in (ps.rounds.probation)
            self.admission.activate_pending()

    def close(self) -> None:
        """Step the round's sum (--shards: commit it across the shards, in the background) and open the next."""
        if self.state.shards is not None:
            self.bsp.commit_in_background(self._commit_sharded)
            return
        self.next_round(self.bsp.step_store())
        self.bsp.resolve()

    def next_round(self, batch: int) -> None:
        """The round stepped with `batch` samples: open the next; what the step made due runs."""
        s = self.state
        self.bsp.next_round()
        self.deadlines.round_closed(batch)
        self.sampling.round_closed()
        s.next_round()
        self.epochs.first_round()
        self.milestones.advance(batch)
        self.path_trial.round_closed(batch)  # may switch the path: the round's replies say so
        if not s.done and not self.path_trial.awaiting:  # a newcomer waits for the parameters too
            self.admission.activate_pending()

    async def _commit_sharded(self) -> None:
        """--shards: step every range at once (the shards' in their processes, range 0 here), then
        run what needs the whole model (evaluation, checkpoints) before any worker hears of the
        new round, so the shards hold still while their ranges are fetched."""
        s = self.state
        try:
            if not s.done:
                batch = await self.bsp.commit_shards(wait_s=self.commit_wait_s)
                self.next_round(batch)
                await self.whole_model.run_after_fetch()
        except Exception as exc:  # noqa: BLE001 (a shard failed, or a bug: either way the ranges may disagree)
            error = str(exc) if isinstance(exc, ShardFailure) else f"round commit failed: {exc!r}"
            s.metrics.write("shard_failure", step=s.step, error=error)
            self.stop(f"stopping: {error}")

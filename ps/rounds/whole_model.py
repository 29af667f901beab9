"""The whole model for what needs it (an evaluation, a checkpoint, the job's last checkpoint) while it
is not all on this server: with --allreduce the parameters are the workers' (the group's hub is asked
for a snapshot, and the actions wait for it), with --shards the ranges are the shard servers' (the round's
commit fetches them before any worker hears of the new round, so they hold still)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from common.errors import InvalidArgument
from ps.rounds.state import JobState
from common.transport.chunked import Vector, as_tensor
from common.transport.messages import GroupInfo


class WholeModel:
    """Actions waiting for the whole model, the snapshot request, and the shards' fetched view."""

    def __init__(self, state: JobState, shard_state: tuple[torch.Tensor, dict[str, Any] | None] | None) -> None:
        self.state = state
        self.snapshot_requested = False  # allreduce: the hub is asked for its parameters (a path trial's switch back: any member)
        self.waiting: list[Callable[[], None]] = []  # evals/checkpoints waiting for them
        self.loading = False
        self.shard_state = shard_state  # --shards: what load_shards hands the shards (initial or resumed)
        self.full_view: tuple[torch.Tensor, dict[str, Any]] | None = None  # --shards: fetched whole model

    def defer(self, action: Callable[[], None]) -> bool:
        """Run `action` (an evaluation, a checkpoint) once the whole model is here; False: run it now.
        Allreduce: the store's parameters are stale until the group's hub sends a snapshot, so ask for one.
        --shards: the round's commit fetches the shards' ranges before it answers the workers."""
        s = self.state
        if self.loading or (s.rendezvous is None and s.shards is None and not self.snapshot_requested):
            return False
        self.waiting.append(action)
        if s.rendezvous is not None:
            self.snapshot_requested = True
        return True

    def request_snapshot(self, first: Callable[[], None]) -> None:
        """Ask the members for the parameters (a path trial's switch back); `first` runs once they are
        here, before the evaluations and checkpoints that wait for them too."""
        self.snapshot_requested = True
        self.waiting.insert(0, first)

    def hand_shards(self, shard_state: tuple[torch.Tensor, dict[str, Any] | None]) -> None:
        """--shards, before the start: what load_shards hands the shards instead (a checkpoint's parameters
        and optimizer state)."""
        self.shard_state = shard_state

    def ended(self, reason: str) -> None:
        """The job is done (RoundEvents.ended): with --allreduce the last checkpoint needs the final global
        model, so it is asked for."""
        self.defer(lambda: None)

    def asks_snapshot(self, group: GroupInfo) -> bool:
        """Whether a reply to the member in `group` asks it for a snapshot (allreduce, when one is wanted:
        the group's hub, the member with the largest batch, so the fastest: the push of the parameters
        and the optimizer state then costs the worker with the most CPU to spare, not a slow one)."""
        return self.snapshot_requested and group.rank == group.hub_rank and group.world_size > 0

    async def run_after_fetch(self) -> None:
        """--shards: fetch the whole model if an action waits for it, then run the actions."""
        if not self.waiting:
            return
        await self.fetch()
        self.run_waiting()

    def run_waiting(self) -> None:
        """The evaluations/checkpoints that waited for the whole model, now that it is here."""
        actions, self.waiting = self.waiting, []
        self.loading = True
        try:
            for action in actions:
                action()
        finally:
            self.loading = False

    async def fetch(self) -> None:
        """--shards: gather every range and the optimizer state (for checkpoint_state and evaluation)."""
        s = self.state
        if s.shards is not None:
            self.full_view = await s.shards.fetch(s.store.flat, s.store.optimizer_state())

    async def load_shards(self, key: bytes) -> None:
        """--shards: hand every shard its range (initial or resumed parameters) and the workers' key
        before workers join."""
        s = self.state
        if s.shards is None or self.shard_state is None:
            return
        params, optimizer = self.shard_state
        await s.shards.load(s.spec.to_json(), params, optimizer, s.round, s.membership.max_workers, key)
        self.shard_state = None

    def params(self) -> torch.Tensor:
        """A copy of all parameters (--shards: as last fetched from the shards)."""
        s = self.state
        if s.shards is None:
            return s.store.snapshot()
        assert self.full_view is not None, "fetch_whole_model() first"
        return self.full_view[0].clone()

    def optimizer_state(self) -> dict[str, Any]:
        """The whole optimizer state (--shards: as last fetched)."""
        s = self.state
        if s.shards is None:
            return s.store.optimizer_state()
        assert self.full_view is not None, "fetch_whole_model() first"
        return self.full_view[1]

    def load_snapshot(self, values: Vector) -> None:
        """Rank 0's parameters (and optimizer state) become the global model; then the evaluations and
        checkpoints that waited."""
        s = self.state
        numel = s.store.numel
        if values.numel() == numel:
            s.store.assign(values)
            s.store.load_flat_optimizer_state(None)
        else:
            whole = as_tensor(values)
            try:  # first: a malformed state changes nothing
                s.store.load_flat_optimizer_state(whole[numel:])
            except ValueError as exc:
                raise InvalidArgument(f"the snapshot's optimizer state: {exc}") from None
            s.store.assign(whole[:numel])
        s.payload.invalidate()
        self.snapshot_requested = False
        s.metrics.write("snapshot", step=s.step, epoch=s.epoch)
        self.run_waiting()

"""The core of a shard server (--shards): one contiguous range of the parameters and its optimizer.

No gRPC here (ps/shards/servicer.py translates). A shard knows nothing of membership or the plan:
workers push their slice of the gradient for the open round, the slice is summed batch-weighted
as it arrives (and kept until the round is decided), and the coordinator's Commit names the
contributors whose slices count. A slice from anyone else is taken out again and its push refused,
so a shard steps with exactly the batches the coordinator stepped with. Pushes and pulls carry the
worker's secret, which the shard checks with the key its coordinator loaded it with (ps.serving.worker_keys).

A worker id that left the job or was evicted is revoked by the coordinator's next Commit (after that
commit's decision, which may still count its slice as the coordinator did): from then on its pushes and
pulls are refused whatever secret they carry. A push needs a Pull of the range by its worker since the
load (ShardStaging._check_pulled). The round's newcomers enter after that commit, so a departed id
stages at most one slice, in the round it departed in, which the commit drops; the members of a round
and those gone during it fit the pending slices (twice the job's worker limit).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import torch

from common.errors import FailedPrecondition, InvalidArgument
from common.job.spec import JobSpec
from common.params.aggregation import WeightedMean
from common.params.store import ParameterStore
from common.transport.chunked import Vector
from common.transport.messages import PushMeta, ShardAck, StepHeader, StepReply
from common.transport.wire import ChunkReceiver, check_wire_dtype
from ps.serving.worker_keys import KEY_BYTES, WorkerKeys
from ps.shards.staging import ShardStaging

MAX_WAIT_S = 3600.0


class ShardCore(ShardStaging):
    """State of one shard; driven from one asyncio event loop. What it holds, who may stage a slice and
    the checks a slice passes are ShardStaging's (staging.py); the calls are this class's."""

    # ------------------------------------------------------------ coordinator
    def load(self, state: dict[str, Any]) -> None:
        """(Re)configure: job spec, range, values, optimizer state (or None), open round, push limit."""
        spec = JobSpec.from_json(state["spec"])
        start, stop, round_ = int(state["start"]), int(state["stop"]), int(state["round"])
        params = state["params"]
        if not (0 <= start < stop) or not isinstance(params, torch.Tensor) or params.shape != (stop - start,):
            raise InvalidArgument(f"a shard load needs a 1-d tensor of stop - start values for [{start}, {stop})")
        if spec.mode != "bsp" or spec.allreduce:
            raise InvalidArgument("shards serve BSP jobs without --allreduce")
        try:
            keys = WorkerKeys(bytes.fromhex(state["worker_key"]))
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"a shard load needs the job's worker key (hex, {KEY_BYTES}+ bytes): {exc}") from None
        store = ParameterStore(params, spec)
        if state.get("optimizer") is not None:
            store.load_optimizer_state(state["optimizer"])
        store.before_change.append(self.payload.complete)  # a reply in flight sends its round's values whole
        self._abandon("the shard was reloaded (the coordinator restarted?); rejoin")
        self._pulled.clear()
        self.spec, self.start, self.stop, self.round, self.keys = spec, start, stop, round_, keys
        # room for every worker of the job twice over: strangers' slices cannot crowd out the workers'
        self.max_pending = 2 * max(1, int(state.get("max_workers", spec.workers)))
        self.store, self._sum = store, WeightedMean(stop - start, scale=spec.global_batch)
        self.payload.invalidate()

    async def commit(self, round_: int, contributors: dict[str, int], lr: float, wait_s: float,
                     revoked: tuple[str, ...] = ()) -> ShardAck:
        """Close the open round: wait (up to wait_s) for the contributors' slices, drop the others',
        step the optimizer on the batch-weighted mean, and answer the waiting pushes; then refuse the
        `revoked` worker ids from now on."""
        try:
            return await self._commit(round_, contributors, lr, wait_s)
        finally:
            self.revoke(revoked)

    async def _commit(self, round_: int, contributors: dict[str, int], lr: float, wait_s: float) -> ShardAck:
        store, total = self._require_loaded(), self._sum
        assert total is not None
        if round_ != self.round:
            raise FailedPrecondition(f"commit for round {round_}; the shard's open round is {self.round}")
        if not lr > 0 or not math.isfinite(lr):
            raise InvalidArgument(f"lr must be finite and > 0, got {lr}")
        if not 0 <= wait_s <= MAX_WAIT_S:
            raise InvalidArgument(f"wait_s must be in [0, {MAX_WAIT_S:.0f}], got {wait_s}")
        deadline = asyncio.get_running_loop().time() + wait_s
        while not set(contributors) <= set(self._staged):
            self._arrived.clear()
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                break
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                break
        if round_ != self.round:  # reloaded while waiting
            raise FailedPrecondition(f"commit for round {round_}; the shard's open round is {self.round}")
        # a slice counts only at the batch the coordinator counted for its worker (the plan's)
        for worker_id in [w for w, staged in self._staged.items() if contributors.get(w) != staged.batch]:
            self._unstage(worker_id)
        missing = tuple(sorted(set(contributors) - set(self._staged)))
        applied = total.weight
        if applied:
            store.set_lr(lr)
            store.apply_gradient(total.result(), total.bound)
            self.payload.invalidate()
        total.reset()
        self._staged.clear()
        self.round += 1
        decided, self._decided = self._decided, None
        if decided is not None and not decided.done():
            decided.set_result(frozenset(contributors) - set(missing))
        return ShardAck(self.round, applied, missing)

    def fetch(self) -> dict[str, Any]:
        store = self._require_loaded()
        return {"start": self.start, "stop": self.stop, "round": self.round, "params": store.snapshot(),
                "optimizer": store.optimizer_state()}

    # ---------------------------------------------------------------- workers
    def begin_push(self, meta: PushMeta) -> ChunkReceiver:
        spec = self._require_loaded_spec()
        self._authenticate(meta.worker_id, meta.secret)
        self._check_pulled(meta.worker_id)
        check_wire_dtype(meta.wire_dtype)
        if meta.kind != "values":
            raise InvalidArgument(f"a shard takes gradient slices (kind values), got {meta.kind!r}")
        if not 0 < meta.batch_size <= spec.global_batch:
            raise InvalidArgument(f"batch size must be in [1, {spec.global_batch}], got {meta.batch_size}")
        meta.times.check()
        meta.check_norms()
        if meta.num_values != self.numel:
            raise InvalidArgument(f"buffer has {meta.num_values} values; this shard holds [{self.start}, {self.stop}), "
                                  f"{self.numel} values")
        self._check_open(meta)
        if len(self._staged) >= self.max_pending:
            raise FailedPrecondition(f"round {self.round} already holds {self.max_pending} slices, the job's worker limit")
        return ChunkReceiver(meta.num_values, meta.wire_dtype)

    async def push(self, meta: PushMeta, values: Vector) -> StepReply:
        """Stage a received slice; answer with the range's new values once the round is committed."""
        self._authenticate(meta.worker_id, meta.secret)  # re-checked: a reload may have changed the key meanwhile
        self._check_open(meta)  # and the round may have moved while the payload streamed in
        self._check_overflow(values, meta.batch_size)
        self._stage(meta.worker_id, meta.batch_size, values)
        if self._decided is None:
            self._decided = asyncio.get_running_loop().create_future()
        decided = self._decided
        self._arrived.set()
        try:
            counted = await asyncio.shield(decided)
        except asyncio.CancelledError:  # the worker gave up (its coordinator push failed): take the slice out
            if self._decided is decided and meta.worker_id in self._staged:
                self._unstage(meta.worker_id)
            raise
        if meta.worker_id not in counted:
            raise FailedPrecondition(f"round {meta.round} closed without this worker's push (evicted, or its batch "
                                     "size was not the one the coordinator counted); rejoin")
        return self.reply()

    def caller(self, worker_id: str, secret: str) -> None:
        """The caller holds the secret of the worker it names, at a loaded shard (else the ServiceError of a pull)."""
        self._require_loaded()
        self._authenticate(worker_id, secret)

    def pull(self, worker_id: str, secret: str, header_only: bool = False, optimizer_state: bool = False,
             wait_for_batch: bool = False) -> StepReply:
        """A worker's pull: the range's current values (`header_only`: the header alone, num_values 0,
        which hands no values and so opens no push here). InvalidArgument for what only the
        ParameterServer serves: the optimizer's state, and the long poll for a batch (a shard holds no plan)."""
        self._require_loaded()
        self._authenticate(worker_id, secret)
        if optimizer_state:
            raise InvalidArgument("a shard serves its range's values, not the optimizer's state (pulled from an "
                                  "unsharded ParameterServer only)")
        if wait_for_batch:
            raise InvalidArgument("wait_for_batch is the ParameterServer's long poll: a shard holds no plan")
        if header_only:
            return StepReply(self._header(0), ())
        reply = self.reply()
        self._note_pull(worker_id)
        return reply

    def reply(self) -> StepReply:
        """The range's current values, in the job's wire dtype."""
        spec = self._require_loaded_spec()
        store = self._require_loaded()
        return StepReply(self._header(self.numel), self.payload.get(self.round, store, spec.wire_dtype))

    def _header(self, num_values: int) -> StepHeader:
        """A reply's header: the open round, and `num_values` of the range in the job's wire dtype."""
        spec = self._require_loaded_spec()
        return StepHeader(round=self.round, version=self.round, epoch=0, batch_size=0, done=False, lr=0.0,
                          global_batch=0, wire_dtype=spec.wire_dtype, num_values=num_values)

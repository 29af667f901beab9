"""What a shard server holds (core.py's ShardCore is one): its range's store, the job's spec and the
workers' key, the open round's staged slices with their batch-weighted sum, the worker ids revoked and
those that pulled the range, and the checks a push passes before its slice is staged: the caller's
secret, a Pull of the range before it, the open round, and a sum and a step that stay finite. No gRPC here.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from common.errors import FailedPrecondition, InvalidArgument
from common.job.spec import JobSpec
from common.params.aggregation import WeightedMean
from common.params.store import ParameterStore
from common.transport.chunked import Vector
from common.transport.magnitude import PUSH_MARGIN, OverflowRisk, magnitude_of
from common.transport.messages import PushMeta
from common.transport.payload import Payload
from ps.serving.worker_keys import WorkerKeys

MAX_REVOKED = 65_536
"""The revoked worker ids a shard remembers (the oldest go first); as many of those that pulled."""


@dataclass
class _Staged:
    batch: int
    values: Vector


class ShardStaging:
    """A shard's state and the checks on who stages what; driven from one asyncio event loop."""

    def __init__(self) -> None:
        self.spec: JobSpec | None = None
        self.start = self.stop = 0
        self.round = 0
        self.max_pending = 0
        self.store: ParameterStore | None = None
        self.keys: WorkerKeys | None = None
        self._sum: WeightedMean | None = None
        self._staged: dict[str, _Staged] = {}
        self._arrived = asyncio.Event()
        self._decided: asyncio.Future[frozenset[str]] | None = None
        self._revoked: dict[str, None] = {}  # worker ids that left or were evicted, oldest first
        self._pulled: dict[str, None] = {}  # worker ids that pulled the range since the load, oldest first
        self.payload = Payload()  # the transport may set its framing (Payload.use_frame)

    @property
    def numel(self) -> int:
        return self.stop - self.start

    @property
    def loaded(self) -> bool:
        return self.store is not None

    def revoke(self, worker_ids: tuple[str, ...]) -> None:
        """Refuse these worker ids' pushes and pulls from now on (they left the job or were evicted)."""
        for worker_id in worker_ids:
            self._revoked[worker_id] = None
            self._pulled.pop(worker_id, None)
        _keep_newest(self._revoked)

    def _note_pull(self, worker_id: str) -> None:
        """`worker_id` (authenticated) was answered the range's values: its pushes may follow."""
        self._pulled.pop(worker_id, None)
        self._pulled[worker_id] = None  # the newest last
        _keep_newest(self._pulled)

    def _check_pulled(self, worker_id: str) -> None:
        """A worker pushes a slice only after a Pull of this range since the shard was loaded, as the coordinator
        asks of its own range (ps.rounds.push_checks): a gradient computed without the range's values
        came from values the shard never handed."""
        if worker_id not in self._pulled:
            raise FailedPrecondition(
                f"worker {worker_id} pushed to this shard before its first Pull here: a worker Pulls every range "
                "(the coordinator's and each shard's) after its Join and computes its first step from them"
            )

    def _authenticate(self, worker_id: str, secret: str) -> None:
        """The caller holds the secret of the worker it names (the shard does not know who is in the job:
        the coordinator's Commit decides whose slices count)."""
        if not worker_id:
            raise InvalidArgument("a push or pull needs a worker id")
        assert self.keys is not None
        self.keys.check(worker_id, secret)
        if worker_id in self._revoked:
            raise FailedPrecondition(f"worker {worker_id!r} left the job or was evicted: its secret is revoked at "
                                     "this shard; rejoin")

    def _check_overflow(self, values: Vector, batch: int) -> None:
        """The commit's step stays finite with this slice in it (common.transport.magnitude), or InvalidArgument. The
        commit's learning rate is not known yet: the job's (the schedule only lowers it) or the current."""
        store, spec, total = self._require_loaded(), self._require_loaded_spec(), self._sum
        assert total is not None
        bound = magnitude_of(values)
        try:
            if not total.admits(values, batch):
                raise OverflowRisk(f"slice values up to {bound:.3g} overflow the round's sum")
            store.check_step(bound * PUSH_MARGIN, lr=max(spec.lr, store.lr))
        except OverflowRisk as exc:
            raise InvalidArgument(f"{exc}: push refused, the range is unchanged (values this large would make it "
                                  "non-finite)") from None

    def _check_open(self, meta: PushMeta) -> None:
        if meta.round != self.round:
            raise FailedPrecondition(f"round {meta.round} is not open; the open round is {self.round}")
        if meta.worker_id in self._staged:
            raise FailedPrecondition(f"worker {meta.worker_id} already pushed for round {self.round}")

    def _stage(self, worker_id: str, batch: int, values: Vector) -> None:
        assert self._sum is not None
        self._sum.add(values, batch)
        self._staged[worker_id] = _Staged(batch, values)

    def _unstage(self, worker_id: str) -> None:
        assert self._sum is not None
        staged = self._staged.pop(worker_id)
        self._sum.remove(staged.values, staged.batch)

    def _abandon(self, reason: str) -> None:
        decided, self._decided = self._decided, None
        if decided is not None and not decided.done():
            decided.set_exception(FailedPrecondition(reason))
        self._staged.clear()

    def _require_loaded(self) -> ParameterStore:
        if self.store is None:
            raise FailedPrecondition("this shard has not been loaded by its coordinator yet")
        return self.store

    def _require_loaded_spec(self) -> JobSpec:
        self._require_loaded()
        assert self.spec is not None
        return self.spec


def _keep_newest(ids: dict[str, None]) -> None:
    """Drop the oldest of `ids` (insertion order) past MAX_REVOKED."""
    while len(ids) > MAX_REVOKED:
        del ids[next(iter(ids))]

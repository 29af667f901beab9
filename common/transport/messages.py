"""The values the server's cores (Coordinator, ShardCore) take from and give to their transport.

Plain frozen dataclasses, no gRPC: the servicers translate protobuf messages to and from these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAX_COMPUTE_MS = 24 * 3600 * 1000.0
PUSH_KINDS = ("values", "report", "snapshot")  # see PushKind in protos/ps.proto


@dataclass(frozen=True)
class PushMeta:
    """The header of a push, as the core sees it."""

    worker_id: str
    round: int
    version: int
    batch_size: int
    compute_ms: float
    wire_dtype: str
    num_values: int
    kind: str = "values"  # "report" / "snapshot": the --allreduce fast path
    generation: int = 0  # a report's group generation (0: not said)
    secret: str = ""  # the worker's secret from Join (common.transport.worker_keys)
    exposed_ms: float = 0.0  # blocked on communication between the last backward and this forward (0: unknown)
    own_exposed_ms: float = 0.0  # of that, the worker's own sending and receiving (not the wait for the round)
    offsets: bool = False  # the chunks carry their offsets and arrive in any order (buckets sent during backward)
    local_sq_norm: float = 0.0  # a report's |g_k|² (float64; 0: not measured)
    global_sq_norm: float = 0.0  # a report's |g|² of the group's mean (float64; 0: not measured)
    data_wait_ms: float = 0.0  # of compute_ms, the wait for the batch from the worker's loader (0: none)


@dataclass(frozen=True)
class GroupInfo:
    """--allreduce: a worker's place in the current process-group generation."""

    generation: int = 0
    rank: int = 0
    world_size: int = 0
    backend: str = ""
    hub_rank: int = 0  # the hub algorithm: the rank that sums this step (ps.rounds.rendezvous.hub_rank)


@dataclass(frozen=True)
class JoinInfo:
    worker_id: str
    index: int
    batch_size: int
    round: int
    version: int
    epoch: int
    group: GroupInfo = GroupInfo()
    rendezvous_host: str = ""
    rendezvous_port: int = 0
    shards: tuple[tuple[str, int, int], ...] = ()  # --shards: (address, start, stop) of the remote ranges
    secret: str = ""  # what the worker's later calls must carry (common.transport.worker_keys)


@dataclass(frozen=True)
class StepReply:
    """What a worker needs for its next step; payload is the encoded parameters."""

    round: int
    version: int
    epoch: int
    batch_size: int
    done: bool
    lr: float
    global_batch: int
    wire_dtype: str
    num_values: int
    payload: Sequence[bytes]  # framed chunks (common.transport.payload: built as a reply reaches them)
    reason: str = ""
    group: GroupInfo = GroupInfo()
    snapshot_requested: bool = False
    optimizer_state: bool = False  # the payload is the optimizer's flat state (common.params.flat_state), not parameters


@dataclass(frozen=True)
class Beat:
    done: bool
    epoch: int
    round: int
    version: int

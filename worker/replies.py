"""What the server tells a worker, as plain values: the Joined record of a Join and the StepPlan of
every push or pull (worker/client.py builds them from the RPC replies; the runtime reads them)."""

from __future__ import annotations

from dataclasses import dataclass

from common.job.spec import JobSpec
from common.transport.layout import Layout


@dataclass(frozen=True)
class ShardTarget:
    """--shards: values [start, stop) of the flat buffer live at `address`."""

    address: str
    start: int
    stop: int


@dataclass(frozen=True)
class Joined:
    worker_id: str
    spec: JobSpec
    layout: Layout
    batch_size: int
    round: int
    version: int
    epoch: int
    index: int
    heartbeat_interval_s: float
    rendezvous_host: str = ""  # --allreduce: the TCPStore the workers' process group meets at
    rendezvous_port: int = 0
    shards: tuple[ShardTarget, ...] = ()  # --shards: the ranges other servers hold
    secret: str = ""  # what every later call as this worker carries (the client adds it itself)


@dataclass(frozen=True)
class StepPlan:
    """What the server said about the next step."""

    round: int
    version: int
    epoch: int
    batch_size: int
    done: bool
    lr: float
    global_batch: int
    reason: str = ""
    generation: int = 0  # --allreduce: the process group to train in (see ps/rounds/rendezvous.py)
    rank: int = 0
    world_size: int = 0
    backend: str = ""
    snapshot_requested: bool = False  # --allreduce, rank 0: push a snapshot of the parameters now
    hub_rank: int = 0  # --allreduce, hub algorithm: the rank that sums this step

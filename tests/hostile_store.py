"""A worker's fast-path group forming on a hostile server's store (tests/hostile_server.py, whose every
Rendezvous reply is "ready" with one value), in a process of its own: gloo reads the store's values in
C++, where one it cannot parse could end the process. `python -m tests.hostile_store HEX` forms group
generation 1 (rank 0 of 2) with the value bytes.fromhex(HEX) and prints what came of it in one line:
the CollectiveError the worker recovers from, or any other exception's type and message."""

from __future__ import annotations

import sys
from datetime import timedelta

import torch.distributed as dist

from common.job.models import build_model
from common.job.spec import JobSpec
from common.transport.messages import GroupInfo, StepHeader
from tests.hostile_server import Scenario, serving
from worker.paths.collective import Collective
from worker.paths.group_store import ServerStore
from worker.transport.client import PSClient

GROUP = {"world_size": 2, "rank": 0, "generation": 1, "backend": "gloo"}


def form(value: bytes) -> str:
    """What forming the group on a store that answers every call ready with `value` ends in."""
    with serving(Scenario(join=GROUP, store={"ready": True, "value": value, "number": 2})) as (_, target):
        client = PSClient(target)
        try:
            joined = client.join("w", 1.0, 10.0)

            def store(generation: int, timeout: timedelta) -> dist.Store:
                return ServerStore(lambda call: client.rendezvous(joined.worker_id, call), generation, timeout)

            collective = Collective(JobSpec(workers=2, global_batch=16), build_model("mlp", (64,), 10, {"hidden": 16}, 0),
                                    store, timeout_s=5.0)
            try:
                collective.ensure_group(StepHeader(0, 0, 0, 8, False, 0.1, 16, group=GroupInfo(1, 0, 2, "gloo")))
            finally:
                collective.close()
        except BaseException as exc:  # noqa: BLE001 (what came of it is the answer)
            return f"{type(exc).__name__}: {exc}".replace("\n", " ")
        finally:
            client.close()
    return "formed"


if __name__ == "__main__":
    print(form(bytes.fromhex(sys.argv[1])))

"""One rank of a fast-path group in its own process, for tests/worker/paths/test_collective.py: `python -m
tests.collective_ranks RANK WORLD PORT ALGORITHM OUT` meets the others at a TCPStore on 127.0.0.1:PORT,
takes ROUNDS steps with the gradients and batches below (`HUBS` names each round's hub) and saves its
parameters and optimizer state to OUT. Rank
VETERAN first takes PRE steps alone, as a worker of an earlier group would have: the group adopts its
parameters and momentum when it forms, and the others start from them."""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from common.job.models import build_model
from common.job.spec import JobSpec
from common.transport.messages import GroupInfo, StepHeader
from worker.paths.collective import Collective

ROUNDS = 3
HUBS = (2, 2, 0)  # the hub moves between rounds, as it does when the controller re-plans
VETERAN, PRE = 1, 2
BUCKET_BYTES = 1024  # several bucket parts in flight


def spec(world: int, algorithm: str) -> JobSpec:
    return JobSpec(workers=world, global_batch=8 * world, momentum=0.9, weight_decay=1e-3, allreduce=True,
                   allreduce_algorithm=algorithm)


def model() -> torch.nn.Module:
    return build_model("mlp", (64,), 10, {"hidden": 16}, 0)


def batch(rank: int, round: int) -> int:
    return 3 + 2 * rank + round


def grads(rank: int, round: int, numel: int) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(100 * round + rank))


def veteran_grads(round: int, numel: int) -> torch.Tensor:
    """The mean gradient of a round the veteran took before this group formed."""
    return torch.randn(numel, generator=torch.Generator().manual_seed(7000 + round))


def tcp_stores(port: int) -> Callable[[int, timedelta], dist.Store]:
    """Collective's stores on a TCPStore at 127.0.0.1:`port`, each generation's keys under a prefix of its own."""
    def store(generation: int, timeout: timedelta) -> dist.Store:
        tcp = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
        return dist.PrefixStore(f"gen-{generation}/", tcp)

    return store


def main(argv: list[str]) -> None:
    rank, world, port, algorithm, out = int(argv[0]), int(argv[1]), int(argv[2]), argv[3], argv[4]
    collective = Collective(spec(world, algorithm), model(), tcp_stores(port), timeout_s=60, bucket_bytes=BUCKET_BYTES)
    numel = collective.params.numel()
    try:
        if rank == VETERAN:
            for round in range(PRE):
                collective.apply(veteran_grads(round, numel), StepHeader(round, round, 0, 1, False, 0.0, 0))
        for round in range(PRE, PRE + ROUNDS):
            b = batch(rank, round)
            plan = StepHeader(round, round, 0, b, False, 0.0, 0,
                              group=GroupInfo(1, rank, world, "gloo", hub_rank=HUBS[round - PRE]))
            assert collective.step(grads(rank, round, numel), b, plan)
        torch.save({"params": collective.params.clone(), "state": collective.local.flat_optimizer_state()}, out)
    finally:
        collective.close()


if __name__ == "__main__":
    main(sys.argv[1:])

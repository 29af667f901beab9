"""Admission: whether a worker may join (the job has not ended, a valid name, cores and GPU id, room in
the job and in the global batch), whether the job has started, and the plan a resumed job starts
from (the checkpoint's batch policy, kept when the same workers rejoin)."""

from __future__ import annotations

import asyncio

from ps.control.config import PolicyConfig
from ps.control.micro import usable_max
from ps.control.policy import BatchPolicy, reconfigured
from common.errors import FailedPrecondition, InvalidArgument
from ps.rounds.epochs import Epochs
from ps.rounds.fast_path import FastPath
from ps.rounds.membership import MAX_NAME
from ps.rounds.state import JobState


def own_max_batch(config: PolicyConfig, declared: int | None) -> int | None:
    """The bound a worker's own max batch puts on its plan: the lower of it and the server's
    --max-batch (None: the server's alone)."""
    return None if declared is None else min(declared, config.default_max_batch)


class Admission:
    """Join checks and the start."""

    def __init__(self, state: JobState, epochs: Epochs, fast_path: FastPath) -> None:
        self.state = state
        self.epochs = epochs
        self.fast_path = fast_path
        self.started = asyncio.Event()
        self.saved_policy: BatchPolicy | None = None  # a checkpoint's, until the start

    def check(self, name: str, cores: float, cuda_device: str | None, max_batch: int | None = None) -> None:
        """Refuse a join, changing nothing. `cuda_device`: the UUID of the GPU the worker computes on
        ("" unknown), None for CPU; `max_batch`: the most samples its memory holds (None: no bound)."""
        s = self.state
        if s.done:
            raise FailedPrecondition(f"the job has ended ({s.reason})")
        s.membership.check_join(name, cores)
        if cuda_device is not None and (len(cuda_device) > MAX_NAME or not cuda_device.isprintable()):
            raise InvalidArgument(f"cuda_device must be a GPU UUID: at most {MAX_NAME} printable characters")
        if not s.policy.can_add(len(s.membership.pending) + 1):
            raise FailedPrecondition(
                f"job full: the global batch {s.spec.global_batch} cannot give one more worker its minimum batch "
                f"({len(s.members)} in the job, {len(s.membership.pending)} waiting); raise --global-batch "
                "or lower --min-batch"
            )
        self.check_memory(max_batch)

    def check_memory(self, max_batch: int | None) -> None:
        """A worker's own max batch must hold its minimum batch (one micro-batch at least), and in BSP
        the workers that would start the job must hold the global batch together."""
        s = self.state
        if max_batch is None:
            return
        cfg = s.policy.config
        if max_batch < 1:
            raise InvalidArgument(f"max_batch must be >= 1 (0: no bound), got {max_batch}")
        floor = max(cfg.min_batch, cfg.micro_batch)
        if max_batch < floor:
            raise FailedPrecondition(f"this worker holds at most {max_batch} samples, below the job's smallest batch "
                                     f"{floor} (--min-batch {cfg.min_batch}, --micro-batch {cfg.micro_batch})")
        if not cfg.keep_global_sum or self.started.is_set() or len(s.membership.pending) + 1 < s.spec.workers:
            return
        held = [m.max_batch for m in s.membership.pending.values()] + [max_batch]
        capacity = sum(usable_max(cfg, b) for b in held)
        if capacity < cfg.global_batch:
            raise FailedPrecondition(
                f"the {len(held)} workers that would start the job hold at most {capacity} samples together "
                f"(their max batches in whole micro-batches), below --global-batch {cfg.global_batch}; "
                "join workers with more memory or lower --global-batch"
            )

    def all_here(self) -> bool:
        """Before the start: the expected workers are all waiting."""
        return len(self.state.membership.pending) >= self.state.spec.workers

    def start_resumed(self) -> bool:
        """Start with the checkpoint's plan if the workers starting the job are the checkpoint's: its
        policy under this server's settings (ps.control.policy.reconfigured), every waiting worker
        in. False: the job starts with a new plan."""
        s = self.state
        names = {m.name for m in s.membership.pending.values()}
        saved = self.saved_policy
        if saved is None or set(saved.workers()) != names:
            return False
        # the command line's settings, the checkpoint's measurements
        s.policy = reconfigured(saved, s.policy.config)
        for member in list(s.membership.pending.values()):
            s.membership.activate(member.worker_id)
            member.activated.set()
        self.epochs.log_adjust(changed=True)
        self.fast_path.regroup()
        return True

"""Admission: whether a worker may join (the job has not ended, a valid name, cores and GPU id, room in
the job and in the global batch), the job's start (its path, its first plan) and the workers waiting
that enter it at a round boundary (a newcomer to a running BSP job on probation first: ps.rounds.probation,
whose probationers enter the plan at a round boundary too), and the plan a resumed job starts from (the checkpoint's batch
policy, kept when the same workers rejoin)."""

from __future__ import annotations

import asyncio
from collections import deque

from ps.control.config import PolicyConfig
from ps.control.global_batch.goodput import AdaptiveConfig
from ps.control.micro import usable_max
from ps.control.policy import BatchPolicy, reconfigured
from common.errors import FailedPrecondition, InvalidArgument
from ps.rounds.bsp import BspRound
from ps.rounds.epochs import Epochs
from ps.rounds.fast_path import FastPath
from ps.rounds.membership import MAX_NAME, Member
from ps.rounds.probation import Probation
from ps.rounds.state import JobState


REFUSALS_LOGGED_PER_MINUTE = 30
"""The most `join_refused` records (and progress lines) a minute: a caller with the token that joins a
full job over and over would otherwise write the metrics log and the server's stderr as fast as it
calls; the records after the bound are counted in the next one written (`unlogged`)."""


def own_max_batch(config: PolicyConfig, declared: int | None) -> int | None:
    """The bound a worker's own max batch puts on its plan: the lower of it and the server's
    --max-batch (None: the server's alone)."""
    return None if declared is None else min(declared, config.default_max_batch)


def job_full(config: PolicyConfig, adaptive: AdaptiveConfig | None, workers: int, in_job: int, waiting: int) -> str:
    """The refusal of a join that the global batch in force has no minimum batch left for, and what
    makes room for `workers` (this one included; `in_job` are active, `waiting` pending). Under
    --adaptive-batch B moves within its bounds and --global-batch is only where it starts, so the
    floor --min-global-batch is what keeps room."""
    each = -(-config.min_batch // config.micro_batch) * config.micro_batch  # whole micro-batches
    need = workers * each
    said = (f"job full: the global batch {config.global_batch} cannot give one more worker its minimum batch "
            f"({in_job} in the job, {waiting} waiting); {workers} workers at --min-batch {config.min_batch} take "
            f"a global batch of {need}")
    if adaptive is None:
        return f"{said}: raise --global-batch to {need} or lower --min-batch"
    low = [flag for flag, value in (("--min-global-batch", adaptive.min_batch), ("--global-batch", adaptive.base_batch),
                                    ("--max-global-batch", adaptive.max_batch)) if value < need]
    return (f"{said}, and --adaptive-batch moves B within [--min-global-batch {adaptive.min_batch}, --max-global-batch "
            f"{adaptive.max_batch}] (--global-batch {adaptive.base_batch} is where it started): raise "
            f"{', '.join(low) or '--min-global-batch'} to {need} or lower --min-batch")


class Admission:
    """Join checks, the start and the waiting workers' entry."""

    def __init__(self, state: JobState, epochs: Epochs, fast_path: FastPath, bsp: BspRound,
                 probation: Probation, adaptive: AdaptiveConfig | None = None) -> None:
        """`adaptive`: --adaptive-batch's bounds on B (None: B is fixed), for the refusal of a full job."""
        self.state = state
        self.adaptive = adaptive
        self.probation = probation
        self.epochs = epochs
        self.fast_path = fast_path
        self.bsp = bsp
        self.started = asyncio.Event()
        self.saved_policy: BatchPolicy | None = None  # a checkpoint's, until the start
        self._refusals_logged: deque[float] = deque()  # when the refusals of the last minute were written
        self._unlogged = 0  # refusals past REFUSALS_LOGGED_PER_MINUTE since the last one written

    def check(self, name: str, cores: float, cuda_device: str | None, max_batch: int | None = None) -> None:
        """Refuse a join, changing nothing. `cuda_device`: the UUID of the GPU the worker computes on
        ("" unknown), None for CPU; `max_batch`: the most samples its memory holds (None: no bound)."""
        s = self.state
        if s.done:
            raise FailedPrecondition(f"the job has ended ({s.reason})")
        s.membership.check_join(name, cores, s.clock())
        if cuda_device is not None and (len(cuda_device) > MAX_NAME or not cuda_device.isprintable()):
            raise InvalidArgument(f"cuda_device must be a GPU UUID: at most {MAX_NAME} printable characters")
        waiting = len(s.membership.pending)
        if not s.policy.can_add(waiting + len(self.probation.probes) + 1):
            workers = len(s.policy.workers()) + waiting + len(self.probation.probes) + 1
            raise FailedPrecondition(job_full(s.policy.config, self.adaptive, workers, len(s.members), waiting))
        self.check_memory(max_batch)

    def refused(self, name: str, exc: FailedPrecondition) -> None:
        """A join was refused for `exc` (the job full, a dataset or a memory that does not fit): the worker
        hears why and exits; whoever watches the server hears it too (a `join_refused` record and its
        line; REFUSALS_LOGGED_PER_MINUTE at most), but for a join after the job ended, which the end's
        own line says."""
        s = self.state
        if s.done:
            return
        now, logged = s.clock(), self._refusals_logged
        while logged and logged[0] <= now - 60.0:
            logged.popleft()
        if len(logged) >= REFUSALS_LOGGED_PER_MINUTE:
            self._unlogged += 1
            return
        logged.append(now)
        unlogged, self._unlogged = self._unlogged, 0
        s.metrics.write("join_refused", worker=name, reason=str(exc), step=s.step, epoch=s.epoch,
                        **({"unlogged": unlogged} if unlogged else {}))

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

    async def admit(self, name: str, cores: float, cuda_device: str | None, max_batch: int | None,
                    switch_paths: bool) -> Member:
        """Add a checked worker as pending and return once it is active: at the start, when all expected
        workers are here; later at the next round boundary (BSP) or at once (ASP). FailedPrecondition
        when the job ends (or turns it away) first."""
        s = self.state
        member = s.membership.admit(name, cores, s.clock(), cuda_device, max_batch, switch_paths)
        try:
            if not self.started.is_set():
                if self.all_here():
                    self.start()
            # BSP: the members are computing the open round with the plan they were told, so a newcomer
            # enters when it closes, with a re-split that its replies carry (unless nobody is training)
            elif s.spec.mode == "asp" or not s.planned():
                self.activate_pending()
            await member.activated.wait()
        except asyncio.CancelledError:
            # the caller gave up (deadline, crash) before it was admitted: free its slot and name
            if member.worker_id in s.membership.pending:
                s.membership.remove(member.worker_id, "gone before it was admitted", s.clock())
            raise
        if s.done or member.worker_id not in s.members:
            raise FailedPrecondition(member.turned_away or f"the job has ended ({s.reason})")
        return member

    def all_here(self) -> bool:
        """Before the start: the expected workers are all waiting."""
        return len(self.state.membership.pending) >= self.state.spec.workers

    def start(self) -> None:
        """All expected workers are here: choose the path (--allreduce auto), the first plan; open round 0."""
        if self.fast_path.undecided and self.fast_path.choose():
            self.bsp.follow_path()  # the workers sum their gradients themselves
        if not self.start_resumed():
            self.activate_pending()
        self.epochs.start(self.state.clock())
        self.started.set()

    def activate_pending(self) -> None:
        """Move pending workers into the job, a newcomer to a running BSP job on probation
        (ps.rounds.probation), and the probationers whose probe is in (all of them where the path takes
        no probation any more) into the plan; re-split B over everyone planned."""
        s = self.state
        probation = self.started.is_set() and self.probation.available()
        entering = self.probation.entering(not self.probation.path_allows())
        if not s.membership.pending and not entering:
            return
        now = s.clock()
        joined = []
        for member in list(s.membership.pending.values()):
            s.membership.activate(member.worker_id)
            member.pushed(now)  # an ASP newcomer's first push is due from now
            if probation and not s.membership.names.proven(member.name):
                self.probation.begin(member, own_max_batch(s.policy.config, member.max_batch))
                member.activated.set()
            else:
                joined.append(member)
        for member in joined + [m for m, _ in entering]:
            bound = own_max_batch(s.policy.config, member.max_batch)
            s.policy.add_worker(member.name, cores=member.cores, max_batch=bound)
            s.metrics.write("join", worker=member.name, cores=member.cores, step=s.step, epoch=s.epoch)
        if joined or entering:
            s.policy.replan()
            for member, probe in entering:  # the policy's first measurement of it (taken at the batch it plans)
                if probe.compute_ms is not None:
                    s.policy_calls.observe(member.name, probe.batch, probe.compute_ms, exposed_ms=probe.exposed_ms)
            s.events.plan_changed.emit()
        for member in s.members.values():
            member.activated.set()
        for _, probe in entering:
            probe.entered.set()

    def resume_with(self, saved: BatchPolicy) -> None:
        """Before the start: a checkpoint's policy, which the job starts from if its workers rejoin."""
        self.saved_policy = saved

    def ended(self, reason: str) -> None:
        """The job is done (RoundEvents.ended): the Joins still waiting wake to hear so."""
        for member in self.state.membership.pending.values():
            member.activated.set()

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
        s.replace_policy(reconfigured(saved, s.policy.config))
        for member in list(s.membership.pending.values()):
            s.membership.activate(member.worker_id)
            member.activated.set()
        s.events.plan_changed.emit()
        return True

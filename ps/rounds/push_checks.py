"""What a push must be before anything changes: from a worker that pulled since its Join, its header
against the job (kind, dtype, batch size, times, squared norms, value count: this server's range, a
probe's the whole gradient), its place in the sequence (the open BSP round once per worker, a probe
once for a round that opened, a known and not too old ASP version), its batch size against what the
server told that worker, a snapshot against the request for one, and its values against overflowing
the step. Each refusal is a ServiceError."""

from __future__ import annotations

from common.errors import FailedPrecondition, InvalidArgument
from ps.rounds.asp import AspUpdates
from ps.rounds.bsp import BspRound
from ps.rounds.fast_path import FastPath
from ps.rounds.membership import Member
from ps.rounds.path_trial import PathTrial
from ps.rounds.probation import Probation
from ps.rounds.state import JobState
from ps.rounds.whole_model import WholeModel
from common.transport.chunked import Vector
from common.transport.magnitude import PUSH_MARGIN, OverflowRisk, magnitude_of
from common.transport.messages import PUSH_KINDS, PushMeta
from common.transport.wire import ChunkReceiver, check_wire_dtype


class PushChecks:
    """The checks, over the shared state and the rounds' own."""

    def __init__(self, state: JobState, bsp: BspRound, asp: AspUpdates, fast_path: FastPath,
                 whole_model: WholeModel, path_trial: PathTrial, probation: Probation) -> None:
        self.state = state
        self.probation = probation
        self.path_trial = path_trial
        self.bsp = bsp
        self.asp = asp
        self.fast_path = fast_path
        self.whole_model = whole_model

    def header(self, member: Member, meta: PushMeta) -> ChunkReceiver:
        """Validate a push header from `member`; the receiver for its payload."""
        s = self.state
        check_wire_dtype(meta.wire_dtype)
        self.kind(meta, member)
        self.pulled(member)
        if meta.kind == "snapshot":
            self.snapshot(member, meta)
        elif meta.batch_size <= 0:
            raise InvalidArgument(f"batch size must be > 0, got {meta.batch_size}")
        elif meta.batch_size % s.spec.micro_batch:
            raise InvalidArgument(f"batch size {meta.batch_size} is not a whole number of --micro-batch {s.spec.micro_batch}")
        limit = max(s.spec.global_batch, max(s.policy.plan().values(), default=0))
        if meta.batch_size > limit:
            raise InvalidArgument(f"batch size {meta.batch_size} exceeds the global batch {limit}")
        meta.times.check()
        meta.check_norms()
        if meta.kind == "report":
            if meta.num_values != 0:
                raise InvalidArgument(f"a report carries no values (num_values 0), got {meta.num_values}")
            generation = self.fast_path.generation()
            if not 0 <= meta.generation <= generation:
                raise InvalidArgument(f"a report's generation must be in [0, {generation}] (0: not said), "
                                      f"got {meta.generation}")
            self.sequence(member, meta)
            self.told(member, meta)
            return ChunkReceiver(0, meta.wire_dtype)
        if meta.kind == "snapshot":
            self.snapshot_size(meta.num_values)
        elif self.probation.on(member):  # a probe comes here whole, whatever the path (ps.rounds.probation)
            if meta.num_values != s.layout.numel:
                raise InvalidArgument(f"a probe carries the whole gradient: buffer has {meta.num_values} values, "
                                      f"the layout expects {s.layout.numel}")
        elif meta.num_values != s.own_numel:
            where = f"; this server holds values [0, {s.own_numel}), the shards the rest" if s.shards else ""
            raise InvalidArgument(f"buffer has {meta.num_values} values, the layout expects {s.own_numel}{where}")
        if meta.kind != "snapshot":
            self.sequence(member, meta)
            self.told(member, meta)
        # the chunks are kept as gRPC handed them over: nothing to copy, pool or give back
        return ChunkReceiver(meta.num_values, meta.wire_dtype)

    def kind(self, meta: PushMeta, member: Member) -> None:
        """Gradients go to the server only without --allreduce, and from a probationer on every path (its
        probe); reports and snapshots only with it (and the snapshot a path trial's switch back asks for:
        ps.rounds.path_trial)."""
        fast_path = self.state.rendezvous is not None
        if meta.kind not in PUSH_KINDS:
            raise InvalidArgument(f"push kind must be one of {PUSH_KINDS}, got {meta.kind!r}")
        if self.probation.on(member):  # its probe's gradient, on every path (ps.rounds.probation)
            self.probation.check_kind(member, meta)
            return
        if meta.kind == "snapshot" and self.path_trial.was_asked(member):
            return  # snapshot() tells whether it is still wanted
        if not fast_path and meta.kind == "values":
            self.path_trial.check_gradient()
        if not fast_path and meta.kind != "values":
            raise InvalidArgument(f"a {meta.kind} push is for --allreduce jobs; this job takes gradients (kind values)")
        if fast_path and meta.kind == "values":
            raise InvalidArgument(
                "this job runs the collective fast path (--allreduce): all-reduce among the workers and push a "
                "report (num_values 0), or a snapshot when asked"
            )

    def pulled(self, member: Member) -> None:
        """A worker Pulls after its Join before its first push: Join answers neither the parameters nor,
        under --sampling exact, the samples its first step trains on, so a push without that Pull came
        from neither and would count samples it never saw as trained. Anything goes once the job is done."""
        if not member.pulled and not self.state.done:
            raise FailedPrecondition(
                f"worker {member.name} pushed before its first Pull: after Join a worker Pulls the parameters "
                "(and its samples under --sampling exact) and computes its first step from that reply"
            )

    def snapshot(self, member: Member, meta: PushMeta) -> None:
        """A snapshot comes from the member asked, the group's hub (WholeModel.asks_snapshot), for the
        open round (a path trial's switch back: from any member asked, until one arrived)."""
        s = self.state
        if s.rendezvous is None:
            self.path_trial.check_snapshot(member)
        elif (group := self.fast_path.group_info(member, s.policy.plan())).rank != group.hub_rank:
            raise FailedPrecondition(
                f"only the hub (rank {group.hub_rank}, the largest batch) sends snapshots; worker {member.name} is "
                f"rank {group.rank} of generation {group.generation}"
            )
        if not self.whole_model.snapshot_requested:
            raise FailedPrecondition("no snapshot was requested")
        if meta.round != s.round:
            raise FailedPrecondition(f"snapshot of round {meta.round}; the open round is {s.round}")

    def snapshot_size(self, num_values: int) -> None:
        """A snapshot is the parameters, then the optimizer's flat state if it has any (common.params.flat_state)."""
        s = self.state
        numel, state = s.own_numel, s.store.optimizer_state_numel
        if num_values not in (numel, numel + state):
            with_state = f" or {numel + state} (with the optimizer's state)" if state else ""
            raise InvalidArgument(f"a snapshot has {num_values} values; the layout expects {numel}{with_state}")

    def sequence(self, member: Member, meta: PushMeta) -> None:
        """BSP: the open round, once per worker (a probe: ps.rounds.probation); ASP: a version the server
        had, within --max-staleness. Anything goes once the job is done (the reply tells the worker so)."""
        if self.state.done:
            return
        if self.probation.on(member):
            self.probation.check(member, meta)
        elif self.state.spec.mode == "bsp":
            self.bsp.check_open(member, meta)
        else:
            self.asp.check_version(meta)
            self.asp.check_not_held(member)

    def told(self, member: Member, meta: PushMeta) -> None:
        """A push's batch size is one the server told this worker for the push's round (ASP: version):
        the aggregation weight and the sample count are the server's plan, not the worker's claim.
        The fast path's worker draws a batch before it reads the reply to its previous report, so a
        report may also carry what it was told for the round before."""
        s = self.state
        if s.done or meta.kind == "snapshot":
            return
        step = meta.round if s.spec.mode == "bsp" else meta.version
        told = set(member.told.get(step, ()))
        if meta.kind == "report":
            told |= member.told.get(step - 1, set())
        if meta.batch_size not in told:
            where = f"round {step}" if s.spec.mode == "bsp" else f"version {step}"
            planned = ", ".join(map(str, sorted(told))) or "none"
            raise FailedPrecondition(
                f"batch size {meta.batch_size} is not what this server planned for worker {member.name} at {where} "
                f"(told: {planned}); pull the plan and compute a batch of that size"
            )

    def values(self, member: Member, meta: PushMeta, values: Vector) -> None:
        """BSP: the round's step stays finite with this gradient in it; ASP: θ + Δ stays finite
        (common.transport.magnitude). Otherwise InvalidArgument, and nothing changes."""
        s = self.state
        accumulator = self.bsp.accumulator
        bound = magnitude_of(values)
        try:
            if accumulator is None:
                s.store.check_update(bound)
                return
            if not accumulator.admits(values, meta.batch_size):
                raise OverflowRisk(f"gradient values up to {bound:.3g} overflow the round's sum")
            s.store.check_step(bound * PUSH_MARGIN)
        except OverflowRisk as exc:
            s.metrics.write("overflow_refused", worker=member.name, bound=float(f"{bound:.3g}"), step=s.step,
                            epoch=s.epoch)
            raise InvalidArgument(f"{exc}: push refused, the model is unchanged (values this large would make "
                                  "it non-finite)") from None

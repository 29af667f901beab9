"""The job as a worker holds it: the spec, the data and the model built from it, the parts of the
job's path (the flat parameters the model's are views of or, on a GPU, are loaded from; the
collective, the buckets), and ASP's optimizer; kept in step with the server: the global parameters
pulled, the path switched when the server says, and the whole of it joined again after a loss."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import fields, replace
from functools import partial

import torch
from torch import nn

from common.job.datasets import TrainingData
from common.job.spec import JobSpec
from common.transport.layout import Layout, flatten_params, load_flat
from common.transport.messages import StepHeader
from worker.data.job_build import BuiltJob, build_job
from worker.paths.group_store import ServerStore
from worker.paths.local_optimizer import LocalOptimizer
from worker.paths.path_parts import PathParts
from worker.session.membership import Membership
from worker.transport.client import ServerError
from worker.transport.server_checks import UntrustedReply

log = logging.getLogger(__name__)


class Replica:
    """Builds the job `member` joined (from `built` where the memory probe built it already; a job's
    factory path from `allowed_imports` only) on `device`; `overlap`: the worker allows the buckets
    pushed during backward (the job may still say --no-overlap). The parameters are not loaded yet:
    `pull_global_model`."""

    def __init__(self, member: Membership, device: torch.device, overlap: bool, built: BuiltJob | None,
                 allowed_imports: Sequence[str]) -> None:
        self.member, self.device, self._overlap = member, device, overlap
        joined = member.joined
        self.spec: JobSpec = joined.spec
        if built is None or built.spec != self.spec:
            built = build_job(self.spec, tuple(allowed_imports))
        self.dataset: TrainingData = built.dataset
        self.model: nn.Module = built.model
        if differs := Layout.of(self.model).difference(joined.layout):
            raise ServerError("FAILED_PRECONDITION",
                              f"this worker's model does not match the server's parameter layout: {differs}")
        if device.type != "cpu":
            self.model.to(device)
        self.parts = self._path_parts(flatten_params(self.model).cpu())
        self.optimizer = LocalOptimizer(self.spec, self.parts.params) if self.spec.mode == "asp" else None

    def _path_parts(self, params: torch.Tensor, old: PathParts | None = None) -> PathParts:
        """The parts of the job's path (spec.allreduce) from the flat `params`; `old`, the other
        path's (a switch), closed first."""
        if old is not None:
            old.close()
        member = self.member
        stores = partial(ServerStore, lambda call: member.client.rendezvous(member.worker_id, call))
        return PathParts.build(self.spec, self.model, params, self.device, self._overlap, stores, member.retry_for)

    def switch_path(self, allreduce: bool) -> None:
        """The server switched the path: onto the fast path from the parameters just loaded, or off it."""
        self.parts.arrivals.wait_all()  # a reply still streaming in: its parameters first
        self.spec = replace(self.spec, allreduce=allreduce)
        self.parts = self._path_parts(self.parts.params, self.parts)
        log.info("%s: the job runs on the %s now", self.member.name, "collective fast path" if allreduce else "PS path")
        self._pull_optimizer_state()

    def load(self) -> None:
        """The flat parameters into the model (on a GPU, copied: on the CPU its parameters are views of them)."""
        parts = self.parts
        load_flat(self.model, parts.params if parts.on_device is None else parts.on_device[0].copy_(parts.params))

    def pull(self, header_only: bool = False, wait_for_batch: bool = False) -> StepHeader:
        """The current plan, and (unless `header_only`) the server's parameters into the flat ones;
        `wait_for_batch`: PSClient.pull's long poll of a parked worker."""
        return self.member.client.pull(self.member.worker_id, self.parts.params, header_only=header_only,
                                       wait_for_batch=wait_for_batch)

    def pull_global_model(self) -> StepHeader:
        """The server's parameters, and with --allreduce its optimizer state too (a resumed job's
        momentum: the group starts from this copy when no peer's is further along)."""
        plan = self.pull()
        self._pull_optimizer_state()
        return plan

    def _pull_optimizer_state(self) -> None:
        """--allreduce: the server's optimizer state (its momentum) into the group's copy; nothing on the PS path."""
        if (collective := self.parts.collective) is not None and collective.state_numel:
            member = self.member
            state = member.client.pull_optimizer_state(member.worker_id, collective.state_numel)
            collective.load_optimizer_state(state)

    def recover(self, error: ServerError, plan: StepHeader) -> StepHeader:
        """After a failed push or pull (`plan` in force): resync or rejoin (Membership.recover). The
        step's gradient is dropped; the plan to follow, its parameters (if any) in the flat ones."""
        # allreduce: the local parameters are the group's; a resync keeps them
        return self.member.recover(error, plan, lambda: self.pull(header_only=self.spec.allreduce), self._rejoin)

    def _rejoin(self, deadline: float) -> StepHeader:
        """Join again by `deadline` (time.monotonic), into the same job (PSClient checks its spec, and a
        layout of another model is refused here), and pull its parameters."""
        joined = self.member.join_again(deadline)
        if differs := Layout.of(self.model).difference(joined.layout):
            raise UntrustedReply(f"the server's Join reply gives another parameter layout than this worker's model: {differs}")
        self._take(joined.spec)
        if self.parts.collective is not None:  # a newcomer again: the next group syncs it from a peer
            self.parts.collective.rejoined()
        self.member.adopt(joined)
        if self.optimizer is not None:
            self.optimizer.reset()
        return self.pull_global_model()

    def _take(self, spec: JobSpec) -> None:
        """A rejoined job's spec, which a resume may have changed where common.job.spec.RESUMABLE_FIELDS
        allows (--epochs: its end is the server's; --allreduce, also --allreduce auto's trial meanwhile;
        --balance, --sampling, ...): the path is built again where what it is built from changed."""
        old = self.spec
        if spec == old:
            return
        self.spec = spec
        changed = [f"{f.name} {getattr(old, f.name)} -> {getattr(spec, f.name)}"
                   for f in fields(spec) if getattr(old, f.name) != getattr(spec, f.name)]
        log.info("%s: the job's settings changed: %s", self.member.name, ", ".join(changed))
        if (spec.allreduce, spec.overlap, spec.gradient_norms) != (old.allreduce, old.overlap, old.gradient_norms):
            self.parts = self._path_parts(self.parts.params, self.parts)

    def close(self) -> None:
        self.parts.close()

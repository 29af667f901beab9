"""--allreduce: a worker's step on the collective fast path. The group all-reduces the gradient and
each member steps its own optimizer; the server only hears a report of the step (no values), and
the group's hub sends the parameters when the server asks for a snapshot.

The report's reply is read at the next step, before its all-reduce, not at this one: the new
parameters are already in hand, so the worker computes its next batch while the server waits for
the other reports and closes the round. A batch size the reply names applies to the batch after
that one (a group it names, to the next all-reduce)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from functools import partial

import torch

from common.transport.messages import PushMeta, PushTimes, StepHeader
from worker.paths.process_group import CollectiveError
from worker.paths.regroup import await_regroup, generation_stands
from worker.session.plan_follower import PlanFollower
from worker.session.replica import Replica
from worker.transport.client import ServerError

log = logging.getLogger(__name__)


class CollectiveStep:
    """The fast path's steps of one session: the report of the last one, its reply not yet read."""

    def __init__(self, replica: Replica, follower: PlanFollower) -> None:
        self._replica, self._follower = replica, follower
        self._report: Callable[[], StepHeader] | None = None

    def push(self, grads: torch.Tensor, times: PushTimes, batch: int,
             on_ps_path: Callable[[torch.Tensor, PushTimes], StepHeader]) -> StepHeader | None:
        """Settle the previous report, then all-reduce `grads` (of `batch` samples) and step with the
        group; `on_ps_path(grads, times)` where that reply switched the job to the PS path
        (ps/rounds/path_trial.py). None if the job ended with the previous step (this batch was one
        too many: the settled plan stands)."""
        plan = self._settle_report()
        if plan.done:
            return None
        if self._replica.parts.collective is None:
            return on_ps_path(grads.cpu(), times)
        return self._step(grads, times, batch, plan)

    def _settle_report(self) -> StepHeader:
        """The plan for this step, from the reply to the previous step's report (the hub first sends
        the snapshot it asks for); the current plan when no report is outstanding."""
        report, self._report = self._report, None
        if report is None:
            return self._follower.plan
        plan = self.send_snapshot(report())
        self._follower.follow(plan)  # the model already holds the parameters: the group's step was local
        return plan

    def _step(self, grads: torch.Tensor, times: PushTimes, batch: int, plan: StepHeader) -> StepHeader:
        """All-reduce and step with the group, then report the step to the server. A failed group (a
        peer left or crashed) is re-formed from the server's next generation and the step retried.
        The plan returned is the current one moved on a round."""
        replica, member = self._replica, self._replica.member
        collective = replica.parts.collective
        assert collective is not None
        while True:
            try:
                stands = partial(generation_stands, member.client, member.worker_id, replica.parts.params)
                mean = collective.reduce(grads, batch, plan, stands)
                break
            except CollectiveError as exc:
                log.warning("%s: %s; waiting for the server's next group", member.name, str(exc).splitlines()[0][:300])
                plan = await_regroup(member.client, member.worker_id, replica.parts.params, plan, member.retry_for)
                if plan.done:
                    return self.send_snapshot(plan)
        # the report goes out before the optimizer step: the round closes on the server meanwhile
        local_sq_norm, global_sq_norm = collective.sq_norms
        report = PushMeta(member.worker_id, plan.round, plan.version, batch, PushTimes(times.compute_ms), "float32",
                          kind="report", generation=plan.group.generation, local_sq_norm=local_sq_norm,
                          global_sq_norm=global_sq_norm)
        self._report = member.client.start_push(report, torch.empty(0), replica.parts.params)
        if mean is not None:
            collective.apply(mean, plan)
        return replace(plan, round=plan.round + 1, snapshot_requested=False)

    def send_snapshot(self, plan: StepHeader) -> StepHeader:
        """The member asked (the group's hub): push the parameters and the optimizer state (the server's
        copy of the global model, and what a checkpoint resumes from)."""
        if not plan.snapshot_requested:
            return plan
        replica, member = self._replica, self._replica.member
        assert replica.parts.collective is not None
        snapshot = PushMeta(member.worker_id, plan.round, plan.version, 0, PushTimes(), "float32", kind="snapshot")
        try:
            return member.client.push(snapshot, replica.parts.collective.snapshot(), replica.parts.params)
        except ServerError:
            return plan  # no longer the hub, or the request was served: the server asks again if needed

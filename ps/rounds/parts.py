"""The coordinator's parts (coordinator.py): each concern of ps/rounds built with what it needs of the
others and of the job's settings, who hears of each round event and in what order, and the calls the
concerns make back to the coordinator (a member's revocation, the job's stop, a checkpoint's state).
The calls the servicer makes are the Coordinator's; this module builds what they run through.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from ps.control.policy import BatchPolicy
from common.job.datasets import TrainingData
from common.job.endings import STOPPING
from ps.rounds.evaluator import BackgroundEvaluator
from common.job.spec import JobSpec
from ps.ops.metrics import MetricsLog
from common.params.norm_clip import NormLimits
from common.params.store import ParameterStore
from ps.rounds.adaptive_batch import AdaptiveBatchSizing, AdaptiveSettings
from ps.rounds.admission import Admission
from ps.rounds.asp import AspSettings, AspUpdates
from ps.rounds.bsp import BspRound
from ps.rounds.checkpoint_state import Checkpoints
from ps.rounds.deadlines import Deadlines, Limits
from ps.rounds.departures import Departures
from ps.rounds.epochs import Epochs
from ps.rounds.evaluations import Evaluations
from ps.rounds.events import RoundEvents
from ps.rounds.fast_path import FastPath, check_paths
from ps.rounds.inflight import PushesInFlight
from ps.rounds.job_end import JobEnd
from ps.rounds.milestones import Milestones
from ps.rounds.membership import Member, Membership
from ps.rounds.parking import Parking
from ps.rounds.policy_calls import PolicyCalls
from ps.rounds.path_trial import PathTrial
from ps.rounds.probation import Probation
from ps.rounds.push_checks import PushChecks
from ps.rounds.rendezvous import Rendezvous
from ps.rounds.round_close import RoundClose
from ps.rounds.sampling import Sampling
from ps.rounds.state import JobState
from ps.rounds.step_reply import StepReplies
from ps.rounds.update_norms import UpdateNorms
from ps.rounds.whole_model import WholeModel
from ps.shards.client import RemoteShards
from ps.shards.core import MAX_WAIT_S
from common.transport.layout import Layout, flatten_params
from common.transport.payload import Payload
from ps.serving.worker_keys import WorkerKeys


class CoordinatorParts(JobState):
    """The coordinator's concerns, built and wired to the round events; the calls they make back to it
    (a member's revocation, the job's stop, a checkpoint's state). The Coordinator's calls run through them."""

    def __init__(
        self,
        spec: JobSpec,
        policy: BatchPolicy,
        model: torch.nn.Module,
        dataset: TrainingData,
        *,
        adjust_every: int | None = None,
        asp: AspSettings | None = None,
        adaptive: AdaptiveSettings | None = None,
        max_workers: int | None = None,
        evict_after: float = 10.0,
        checkpoint_every: int | None = None,
        on_checkpoint: Callable[[dict[str, Any], int], None] | None = None,
        metrics: MetricsLog | None = None,
        evaluator: BackgroundEvaluator | None = None,
        clock: Callable[[], float] = time.monotonic,
        rendezvous: Rendezvous | None = None,
        shards: RemoteShards | None = None,
        fast_path_on_gpus: Callable[[], Rendezvous] | None = None, limits: Limits | None = None,
        norms: NormLimits | None = None,
    ) -> None:
        """`fast_path_on_gpus` (--allreduce auto): starts the rendezvous where the fast path is taken (ps.rounds.fast_path);
        `norms`: the bound on a push's norm (ps.rounds.update_norms; default off)."""
        check_paths(spec, rendezvous, shards, fast_path_on_gpus)
        self.spec = spec
        self.replace_policy(policy)
        self.layout = Layout.of(model)
        self.shards = shards
        full = flatten_params(model)
        # --shards: this server holds range 0 of the flat parameters; the shard servers the rest
        self.own_numel = shards.own[1] if shards is not None else self.layout.numel
        self.store = ParameterStore(full[: self.own_numel], spec)
        self.evict_after = evict_after
        self.heartbeat_interval = min(1.0, evict_after / 4)
        self.metrics = metrics or MetricsLog(None)
        self.policy_calls = PolicyCalls(lambda: self.policy, self.metrics, lambda: (self.step, self.epoch))
        self.clock = clock
        self.events = RoundEvents()
        self.membership = Membership(max_workers or spec.workers)
        self.keys = WorkerKeys()  # the workers' secrets (and the shards' key to check them)
        self.round = self.version = self.epoch = self.samples = 0
        self.done, self.reason = False, ""
        self.rendezvous = rendezvous if spec.allreduce else None
        self.payload = Payload()  # the transport may set its framing (Payload.use_frame)
        self.store.before_change.append(self.payload.complete)  # a reply in flight sends its version whole
        self.fast_path = FastPath(self, fast_path_on_gpus)
        samples = len(dataset.train)  # type: ignore[arg-type]  # common.job.splits.Splits checks __len__
        self.sampling = Sampling(self, samples)  # --sampling exact: the epochs' slices
        self.parking = Parking(self, self.sampling.resting)
        self.bsp = BspRound(self, self.parking)
        self.adaptive = AdaptiveBatchSizing(self, self.bsp, adaptive or AdaptiveSettings(), samples)
        self.epochs = Epochs(self, samples, adjust_every, checkpoint_every, self.sampling.completed_epochs)
        self.asp = AspUpdates(self, self.epochs, asp or AspSettings())
        self.probation = Probation(self, samples)  # a newcomer's probe before the plan holds it
        self.admission = Admission(self, self.epochs, self.fast_path, self.bsp, self.probation,
                                   self.adaptive.settings.config)
        self.whole_model = WholeModel(self, (full, None) if shards else None)
        self.evaluation = Evaluations(self, evaluator, self.epochs, self.whole_model)
        self.path_trial = PathTrial(self, self.bsp, self.fast_path, self.whole_model, self.stop, self.adaptive.on)
        self.checks = PushChecks(self, self.bsp, self.asp, self.fast_path, self.whole_model, self.path_trial,
                                 self.probation)
        self.norms = UpdateNorms(self, norms or NormLimits())
        self.end = JobEnd(self, self.whole_model)
        self.limits = limits or Limits()  # what a peer may make the server wait for or hold (ps.rounds.deadlines)
        self.deadlines = Deadlines(self, self.bsp, self.asp, self.epochs, self.probation, self.limits,
                                   lambda w, why: self.departures.remove(w, "evict", why))
        # a Push stream's hold: in_flight.slot(begin_push, cancel)
        self.in_flight = PushesInFlight(self.limits.push_bytes, self.limits.admit_wait_s)
        self.checkpoints = Checkpoints(self, self.whole_model, self.epochs, self.sampling, self.adaptive, self.admission)
        self.milestones = Milestones(self, self.epochs, self.evaluation, self.adaptive, self.path_trial, self.whole_model,
                                     on_checkpoint, self.checkpoint_state)
        self.round_close = RoundClose(self, self.bsp, self.sampling, self.epochs, self.adaptive, self.fast_path,
                                      self.deadlines, self.path_trial, self.whole_model, self.admission, self.milestones,
                                      self.stop, min(evict_after, MAX_WAIT_S))
        self.replies = StepReplies(self, self.sampling, self.asp, self.adaptive, self.fast_path, self.path_trial,
                                   self.whole_model, self.end, self.probation)
        self.departures = Departures(self, self.admission, self.epochs, self.fast_path, self.end, self.round_close,
                                     self.stop, evict_after)
        self._subscribe()

    def _subscribe(self) -> None:
        """Who hears of each round event, in this order."""
        events = self.events
        events.plan_changed.subscribe(lambda: self.epochs.log_adjust(changed=True))
        events.plan_changed.subscribe(self.fast_path.regroup)
        for removed in (self.sampling.removed, self.path_trial.removed, self.end.forget, self.bsp.forget,
                        self.probation.removed):
            events.member_removed.subscribe(removed)
        events.member_removed.subscribe(lambda member: self.asp.release())  # SSP: a slowest worker gone lets the others go on
        events.member_removed.subscribe(self._revoke)
        for ended in (self.epochs.ended, lambda reason: self.asp.release(), self.whole_model.ended, self.admission.ended,
                      self.probation.ended):
            events.ended.subscribe(ended)

    def _revoke(self, member: Member) -> None:
        """`member` left or was evicted: its push streams still arriving end (ps.rounds.inflight), and with
        --shards its id is revoked at every shard with the next commit, before the round's newcomers enter
        (ps.shards.core). Its calls here are refused from now on (Membership.get), the fast path's store
        included (a new group generation drops its keys)."""
        self.in_flight.drop(member.worker_id, str(self.membership.gone(member.worker_id)))
        if self.shards is not None:
            self.shards.revoke(member.worker_id)
    def checkpoint_state(self) -> dict[str, Any]:
        """A self-contained snapshot of everything needed to resume (tensors cloned)."""
        return self.checkpoints.state_dict()
    def stop(self, reason: str = STOPPING) -> None:
        """Graceful shutdown: drop the open round's partial sum; every worker's next call hears the job stops."""
        if self.done:
            return
        self.bsp.abort()
        self.finish(reason)
        self.bsp.resolve()
        self.end.check()

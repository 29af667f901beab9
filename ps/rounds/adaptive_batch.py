"""`--adaptive-batch gns` on the coordinator: the gradient noise scale measured round by round from
the pushes (ps/control/global_batch/gns.py), and at every `--adapt-every` the decision (ps/control/global_batch/goodput.py)
that may change the global batch B, re-split over the workers in the same step; the learning rate of
the B in force.

Each BSP push's |g_k|² and b_k is noted as it arrives and the round's |g|² when its sum closes, all
summed in float64 (common.params.aggregation.squared_norm); the estimator takes the round then. Epochs
count samples, whatever B is, so a change of B at a round boundary leaves "every sample once per
epoch" as it was. Off (the default) it costs nothing: no norms, the job's LR schedule as given."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from typing import Any

from ps.control.global_batch.decider import AdaptiveBatch
from ps.control.global_batch.goodput import (DECIDE_EVERY, MIN_ROUNDS, OUTSIDE, PROBE, SETTLE_ROUNDS, AdaptiveConfig,
                                              Decision, epoch_bound, moved, probe_batch)
from ps.control.global_batch.gns import NoiseScaleEstimator
from ps.control.performance import RoundModel, global_round_model
from ps.control.policy import build_policy, with_global_batch
from common.params.aggregation import squared_norm
from ps.rounds.bsp import BspRound
from ps.rounds.state import JobState
from common.transport.chunked import Vector
from common.transport.messages import PushMeta

_ROUND_TIMES = 64
"""Round times kept since the last decision (their median is the measured round at the current B)."""
DECISION_SHARE = 0.05
"""The most of the job's wall time the decisions on B take: one that took d seconds of its thread's
CPU is followed by the next no sooner than d / DECISION_SHARE seconds after it, however many rounds
--adapt-every counts. A decision prices every candidate B's plan (the model policy: a solve each,
5-30 ms on one core for 4 workers), and it runs in the step that closes a round: where a round takes a
few ms (the teacher MLP on the fastest worker alone, 4-5 ms) a decision every 8 rounds took as much
time as the rounds."""


@dataclass(frozen=True)
class AdaptiveSettings:
    """`--adaptive-batch gns` (config set) or off (None); `every` None: a decision at each epoch's end,
    N: every N rounds."""

    config: AdaptiveConfig | None = None
    every: int | None = DECIDE_EVERY


class AdaptiveBatchSizing:
    """The noise-scale measurement and the decisions on B (all no-ops when off)."""

    def __init__(self, state: JobState, bsp: BspRound, settings: AdaptiveSettings, samples_per_epoch: int) -> None:
        """`samples_per_epoch`: the training set's size (a B leaves an epoch enough rounds)."""
        self.state = state
        self.samples_per_epoch = samples_per_epoch
        bsp.summed.subscribe(self.close)
        self.settings = settings
        self.on = settings.config is not None
        self.decider = AdaptiveBatch(settings.config) if settings.config is not None else None
        self.estimator = NoiseScaleEstimator()
        self._batches: list[int] = []
        self._norms: list[float] = []
        self._subs: list[tuple[str, int, float]] = []  # each push's worker, sub-batch and |g_s|² (0: not measured)
        self._unsplit: set[str] = set()  # workers whose rounds alone came without a sub-batch's norm
        self._reported: list[float] = []  # --allreduce: the reports' |g|²
        self._rounds = 0  # since the last decision
        self._round_ms: list[float] = []
        self._closed_at: float | None = None
        self._decision_s = 0.0  # the last decision's CPU
        self._decided_at = -float("inf")
        self._rounds_at: dict[int, float] = {}  # B -> median round ms measured at it (the latest stay)
        self._noise_at: dict[int, float] = {}  # B -> the relative standard error of that median

    # ---------------------------------------------------------------- measurement
    def push(self, worker: str, meta: PushMeta, grad: Vector) -> None:
        """`worker`'s BSP push taken into the open round's sum, or an --allreduce report with the norms it
        measured (|g|² of the group's mean the same in every report of a round)."""
        if not self.on:
            return
        report = meta.kind == "report"
        self._batches.append(meta.batch_size)
        self._norms.append(meta.local_sq_norm if report else squared_norm(grad))
        self._subs.append((worker, meta.sub_batch, meta.sub_sq_norm))
        if report and meta.global_sq_norm > 0:
            self._reported.append(meta.global_sq_norm)

    def close(self, mean: Vector | None) -> None:
        """The open round's batch-weighted mean before the step (--allreduce: None, the reports carry
        |g|²): one estimate from its pushes."""
        if not self.on:
            return
        batches, norms, reported, subs = self._batches, self._norms, self._reported, self._subs
        self._batches, self._norms, self._reported, self._subs = [], [], [], []
        now = self.state.clock()
        if self._closed_at is not None:
            self._round_ms.append((now - self._closed_at) * 1000.0)
            del self._round_ms[:-_ROUND_TIMES]
        self._closed_at = now
        if mean is None and (not reported or 0.0 in norms):
            return  # a report without norms (a worker that does not measure them)
        if batches:
            try:
                x = squared_norm(mean) if mean is not None else statistics.median(reported)
                if not self._observe_alone(batches, x, subs):
                    self.estimator.observe(batches, norms, x)
            except ValueError as exc:  # a round the estimator cannot read (say, fp32 rounding of tiny norms)
                self.state.metrics.sample("gns_skipped", step=self.state.step, why=str(exc))

    def _observe_alone(self, batches: list[int], sq_norm: float, subs: list[tuple[str, int, float]]) -> bool:
        """A round of one worker that measured a sub-batch's norm: its pair within the round (True). One
        told to train alone (its batch the B in force) that sent none (a loop of the user's own, or the
        fast path's report) is noted, so that `_measurable` stops counting on its rounds alone until
        one comes with a sub-batch; a round left to one worker by another's departure is not."""
        active = [k for k, b in enumerate(batches) if b > 0]
        if len(active) != 1:
            return False
        worker, sub, sub_sq_norm = subs[active[0]]
        if sub:
            observed = self.estimator.observe_sub(batches[active[0]], sq_norm, sub, sub_sq_norm)
            self._unsplit.discard(worker)
            return observed
        if self.decider is not None and 2 <= batches[active[0]] == self.decider.batch:
            self._unsplit.add(worker)
        return False

    # ---------------------------------------------------------------- decisions
    def lr_at(self, epoch: int) -> float:
        """The job's LR schedule at `epoch`, times the rule's factor for the B in force."""
        base = self.state.spec.lr_at(epoch)
        return base * self.decider.lr_factor() if self.decider is not None else base

    def after_round(self) -> None:
        """--adapt-every N: decide after every N rounds; at once, whatever the schedule, where B is outside
        the range a decision may choose from (`_range`: B₀ larger than an epoch holds
        goodput.MIN_STEPS_PER_EPOCH rounds of, or than the workers' bounds make up): no measurement
        could keep it there, and every round at it is spent where no decision would go. While the batch
        policy re-probes parked workers (its last decision's phase "reprobe") no decision is due and the
        rounds are not B's measure: they time a plan that brought back workers the policy had parked,
        until the policy's next decision judges it (docs/policies.md, "the round judges a re-probe")."""
        if self.on:
            self._rounds += 1
            reprobing = self.state.policy.report().get("phase") == "reprobe"
            if reprobing:
                self._round_ms = []
            scheduled = (self.settings.every is not None and self._rounds >= self.settings.every and not reprobing
                         and self.state.clock() - self._decided_at >= self._decision_s / DECISION_SHARE)
            if scheduled or self._outside():
                self.decide()

    def _range(self) -> tuple[int, int]:
        """The global batches a decision chooses from: the flags' range, narrowed to what the workers'
        bounds make up and to what leaves an epoch MIN_STEPS_PER_EPOCH rounds."""
        config = self.settings.config
        assert config is not None
        lower, upper = self.state.policy.global_batch_range()
        upper = epoch_bound(config.max_batch if upper is None else upper, self.samples_per_epoch)
        return max(lower, config.min_batch), upper

    def _outside(self, bounds: tuple[int, int] | None = None) -> bool:
        """Whether B now is outside `bounds` (`_range` where not given), where it can move (lower <= upper)."""
        lower, upper = self._range() if bounds is None else bounds
        batch = self.decider.batch if self.decider is not None else lower
        return lower <= upper and not lower <= batch <= upper

    def at_epoch_end(self) -> None:
        """The default schedule: decide at each epoch's end."""
        if self.on and self.settings.every is None:
            self.decide()

    def decide(self) -> None:
        """One decision on B; a change re-splits B over the workers and sets the LR, in this step."""
        s, decider = self.state, self.decider
        assert decider is not None
        policy = s.policy
        if not policy.plan():
            return
        current = decider.batch
        started = time.thread_time()
        decision, basis = self._decision(current)
        self._decision_s, self._decided_at = time.thread_time() - started, s.clock()
        cpu_ms = round(self._decision_s * 1000.0, 3)
        if decision.changed:
            try:
                s.replace_policy(with_global_batch(policy, decision.batch))
            except ValueError as exc:  # the workers' bounds cannot make it up after all: keep B
                s.metrics.write("adapt", step=s.step, epoch=s.epoch, **{**decision.record(), "batch": current, "changed": False},
                                global_batch=current, lr=self.lr_at(s.epoch), error=str(exc), basis=basis, cpu_ms=cpu_ms)
                return
            decider.apply(decision)
            self._round_ms = []
        s.store.set_lr(self.lr_at(s.epoch))  # adascale: φ moved, even where B did not
        self._rounds = 0
        s.metrics.write("adapt", step=s.step, epoch=s.epoch, **decision.record(), lr=self.lr_at(s.epoch),
                        global_batch=decider.batch, rounds=self.estimator.estimate().rounds, basis=basis, cpu_ms=cpu_ms)
        if decision.changed:
            s.events.plan_changed.emit()

    def _decision(self, current: int) -> tuple[Decision, str]:
        """The decision at B now and its basis: a goodput move that the rounds measured since contradict
        by more than their noise is taken back ("measured"; B does not pass the batch taken back to in
        that direction for decider.TAKE_BACK_MEMORY decisions, or until φ is decider.REOPEN_FACTOR
        from the φ it was judged at, decider.AdaptiveBatch.review); under a
        policy without a fitted model, B measured alone is probed against a second B ("probe"), so
        that the line through both replaces the guess; else the goodput scan on the round model,
        moving only on a gain beyond what φ's standard error could explain. Candidates leave an epoch
        at least goodput.MIN_STEPS_PER_EPOCH rounds and keep φ measurable (`_measurable`)."""
        decider = self.decider
        assert decider is not None
        config, noise_scale = decider.config, self.estimator.estimate()
        phi = noise_scale.phi
        lower, upper = self._range()
        round_model, basis = self._round_model(current)
        predict = None if round_model is None else round_model.predict_global
        if self._outside((lower, upper)):  # into the range at once, measured or not (`after_round`)
            return decider.note(moved(config, current, min(max(current, lower), upper), phi, OUTSIDE, predict)), basis
        reviewed = decider.review(phi, self._rounds_at, self._noise_at, predict)
        if reviewed is not None:
            return reviewed, "measured" if reviewed.changed else basis
        lower, upper = decider.bounds(lower, upper, phi)
        probe = (probe_batch(current, lower, upper, phi, predict, config.base_batch, self._measurable)
                 if len(self._rounds_at) < 2 and current in self._rounds_at else None)
        if basis == "guess" and phi is not None and probe is not None:
            return decider.note(moved(config, current, probe, phi, PROBE, predict)), "probe"
        return decider.choose(phi, lower, upper, predict, upward_only=basis == "guess", phi_sd=noise_scale.phi_sd,
                              measurable=self._measurable), basis

    def _measurable(self, batch: int) -> bool:
        """Whether φ stays measurable at `batch`: the policy's plan there trains two or more workers (a
        job of one worker: one), or one that measures a sub-batch's norm (two samples or more, and not
        seen training alone without one). At the B in force, the plan installed; at another B, the plan
        the policy predicts (True where it has none to tell: gns.py needs a pair of batches in a round,
        a lone worker's batch and its first part, or two rounds at different batches of a lone worker)."""
        policy = self.state.policy
        installed = policy.plan()
        plan = installed if self.decider is not None and batch == self.decider.batch else policy.predicted_plan(batch)
        return plan is None or self._measurable_plan(plan, len(installed))

    def _measurable_plan(self, plan: dict[str, int], workers: int = 2) -> bool:
        """Whether `plan` gives φ a pair each round (`workers`: how many the job has now)."""
        active = [(k, b) for k, b in plan.items() if b > 0]
        if len(active) >= min(2, workers):
            return True
        return len(active) == 1 and active[0][1] >= 2 and active[0][0] not in self._unsplit

    def _round_model(self, current: int) -> tuple[RoundModel | None, str]:
        """T(B) and what it rests on (ps/control/performance.global_round_model: the policy's fitted
        model, else the line through the rounds measured at two or more B, else the times measured at
        B now scaled with B, trusted upward only). The median round at B now is noted first (a
        take-back compares it with the B before)."""
        policy = self.state.policy
        if len(self._round_ms) >= MIN_ROUNDS:
            settled = self._round_ms[SETTLE_ROUNDS:]
            at = self._rounds_at[current] = statistics.median(settled)
            # the median's standard error, about 1.25 times the mean's
            self._noise_at[current] = 1.25 * statistics.stdev(settled) / (at * len(settled) ** 0.5) if at > 0 else 0.0
        active = {k: t for k, t in policy.smoothed_ms().items() if policy.plan().get(k)}
        median = statistics.median(self._round_ms) if self._round_ms else None
        return global_round_model(policy.predicted_round_ms, current, self._rounds_at, active, median)

    # ---------------------------------------------------------------- reports and checkpoints
    def status(self) -> dict[str, Any]:
        """The fields of Status: the mode, φ, the efficiency of B now and the LR (off: no φ)."""
        decider = self.decider
        return {"adaptive_batch": "off" if decider is None else "gns", "noise_scale": self.estimator.estimate().phi,
                "efficiency": None if decider is None else decider.efficiency(), "lr": self.lr_at(self.state.epoch)}

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's `adaptive` entry (none when off), with the workers noted training alone
        without a sub-batch (`unsplit`). The round times measured at each B are not kept: a resumed job
        measures them again."""
        if self.decider is None:
            return {}
        return {"adaptive": {"decider": self.decider.state_dict(), "gns": self.estimator.state_dict(),
                             "unsplit": sorted(self._unsplit)}}

    def restore(self, checkpoint: dict[str, Any]) -> None:
        """Before the start: the checkpoint's B, φ and estimator; the coordinator's fresh policy at
        that B, so a resumed job goes on at it. A checkpoint written without the flag starts at B₀."""
        saved = checkpoint.get("adaptive")
        if self.decider is None or saved is None:
            return
        if not isinstance(saved, dict) or not {"decider", "gns"} <= set(saved) <= {"decider", "gns", "unsplit"}:
            raise ValueError("the checkpoint's adaptive-batch state must hold 'decider' and 'gns' (and may hold "
                             "'unsplit'), nothing else")
        unsplit = saved.get("unsplit", [])
        if not isinstance(unsplit, list) or not all(isinstance(k, str) and k for k in unsplit):
            raise ValueError("the checkpoint's adaptive-batch 'unsplit' must be a list of worker names")
        estimator = NoiseScaleEstimator.from_state_dict(saved["gns"])
        if estimator.smoothing != self.estimator.smoothing:  # the server's constant, not the file's to set
            raise ValueError(f"the checkpoint's noise-scale smoothing {estimator.smoothing!r} is not this server's "
                             f"{self.estimator.smoothing!r}")
        self.decider.load_state_dict(saved["decider"])
        self.estimator = estimator
        self._unsplit = set(unsplit)
        s = self.state
        s.replace_policy(build_policy(replace(s.policy.config, global_batch=self.decider.batch)))

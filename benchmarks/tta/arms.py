"""The benchmark's arms, each one training run to the target on the emulated cluster: our parameter
server under a batch policy (:func:`benchmarks.hetero.runs.run_cluster`), or PyTorch DDP with one rank
per worker cgroup (:func:`benchmarks.ddp_baseline.run_ddp` in its train-to-target mode). Every arm
returns the same record: its accuracy curve in seconds of training and what it ended at."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks import analysis
from common.ops.arg_types import EvalInterval
from benchmarks.hetero.baselines import with_death_signal, limiters
from benchmarks.hetero.runs import Run, run_cluster
from benchmarks.hetero.settings import Emulation, Settings, log


@dataclass(frozen=True)
class Goal:
    """When a run may stop: at its first evaluation at ``target`` accuracy or above once ``budget_s``
    seconds of training have passed (so that the accuracy within the budget is known too), else at
    the epoch cap of the settings; every arm evaluates as ``eval_every`` says (ps-server's
    --eval-every: every N-th epoch, or K times an epoch)."""

    target: float
    budget_s: float
    eval_every: EvalInterval = EvalInterval((1, 1))

    def reached(self, accuracy: float, seconds: float) -> bool:
        return accuracy >= self.target and seconds >= self.budget_s


PS_ARMS = ("uniform", "dynamic", "model", "model_adaptive")
DDP_ARMS = ("ddp_uniform", "ddp_split")
ARMS = (*DDP_ARMS, *PS_ARMS)
"""Every arm, in the report's order: the two DDP baselines, then our server under each policy."""


def ps_flags(arm: str, min_batch: int, max_batch: int) -> tuple[str, list[str]]:
    """The batch policy of a PS arm and its extra ps-server flags (model_adaptive: --adaptive-batch gns
    from the fixed B within [min_batch, max_batch])."""
    if arm == "model_adaptive":
        return "model", ["--adaptive-batch", "gns", "--min-global-batch", str(min_batch),
                         "--max-global-batch", str(max_batch)]
    return arm, []


def record(curve: list[dict[str, Any]], goal: Goal, **fields: Any) -> dict[str, Any]:
    """An arm's record: time to the target, the best accuracy within the budget and overall, the curve."""
    return {
        "time_to_target_s": analysis.time_to_accuracy(curve, goal.target),
        "accuracy_at_budget": analysis.accuracy_within(curve, goal.budget_s),
        "best_accuracy": max((p["accuracy"] for p in curve), default=None),
        "epochs": curve[-1]["epoch"] if curve else 0,  # trained when last evaluated (a fraction within an epoch)
        **fields,
        "curve": curve,
    }


def run_ps(s: Settings, emu: Emulation, name: str, arm: str, goal: Goal, min_batch: int, max_batch: int) -> dict:
    """One PS arm to the goal (or the epoch cap): its record with the final plan and, adaptive, its B's."""
    policy, extra = ps_flags(arm, min_batch, max_batch)
    extra = [*extra, "--eval-every", goal.eval_every.flag()]
    first_round: list[float] = []

    def stop(cluster: Any, event: dict, run: Run) -> bool:
        if event.get("event") == "first_round":
            first_round.append(float(event["wall_s"]))
        if event.get("event") != "eval" or event.get("accuracy") is None:
            return False
        seconds = float(event["wall_s"]) - (first_round[0] if first_round else 0.0)
        return goal.reached(float(event["accuracy"]), seconds)

    run = run_cluster(s, emu, name, policy, extra_server_args=extra, on_event=stop)
    epochs = analysis.of_kind(run.events, "epoch")
    summaries = analysis.of_kind(run.events, "summary")
    plan = (summaries[-1].get("batch_sizes") if summaries else None) or (epochs[-1]["batch_sizes"] if epochs else None)
    decisions = analysis.of_kind(run.events, "adapt")
    return record(analysis.accuracy_curve(run.events), goal, policy=policy, batch_sizes=plan,
                  global_batches=[d["global_batch"] for d in decisions] or None,
                  global_batch_curve=analysis.global_batch_curve(run.events) or None,
                  below_break_even=analysis.below_break_even(run.events),
                  stopped_at_goal=run.stopped_early, run_wall_s=run.wall_s)


def evaluating_rank(emu: Emulation) -> int:
    """The DDP rank that evaluates: the one with the largest CPU share (its evaluation is off the clock,
    but on the fastest rank it costs the benchmark the least)."""
    return max(range(len(emu.shares)), key=lambda k: emu.shares[k])


def run_ddp_arm(s: Settings, emu: Emulation, name: str, batches: Sequence[int], goal: Goal) -> dict:
    """DDP with these per-rank batches to the goal (or the epoch cap), each rank in its worker's cgroup."""
    from benchmarks.ddp_baseline import run_ddp

    k = len(emu.names)
    reporter = evaluating_rank(emu)
    log(f"{name}: DDP, {k} ranks, batches {list(batches)}, rank {reporter} evaluates ...")
    with limiters(emu, "tta-ddp") as groups:
        preexecs = [with_death_signal(g.preexec if g is not None else None) for g in groups]
        slowdowns = emu.slowdowns if emu.backend is None else [1.0] * k
        result = run_ddp(s.workload, list(batches), preexecs, slowdowns, warmup=0, steps=1,
                         workdir=s.workdir / "runs" / name, timeout_s=s.run_timeout, reporter=reporter,
                         extra_args=["--epochs", str(s.epochs), "--target", str(goal.target),
                                     "--budget", str(goal.budget_s), "--eval-rank", str(reporter),
                                     "--eval-every", goal.eval_every.flag()])
    curve = [{"epoch": e["epoch"], "accuracy": e["accuracy"], "seconds": e["seconds"]} for e in result["evals"]]
    log(f"{name}: done: {result['epochs']} epochs in {result['seconds']} s, best accuracy "
        f"{max((p['accuracy'] for p in curve), default=None)}")
    return record(curve, goal, batch_sizes=dict(zip(emu.names, batches, strict=True)),
                  samples_per_s=result.get("samples_per_s"),
                  stopped_at_goal=bool(curve) and goal.reached(curve[-1]["accuracy"], curve[-1]["seconds"]))


def ddp_batches(s: Settings, emu: Emulation, split: dict[str, int] | None) -> list[int]:
    """Per-rank batches: equal (B / K each) without a split, else the split's in the workers' order
    (a parked worker's 0 raised to 1: every DDP rank takes part in every step)."""
    k = len(emu.names)
    if split is None:
        return [max(1, s.workload.global_batch // k)] * k
    return [max(1, int(split[n])) for n in emu.names]

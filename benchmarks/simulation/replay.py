"""The simulator checked against real runs: each worker's time law, the noise of its steps and the
round's overhead are fitted from real runs of one setup (`benchmarks.hetero`'s per-epoch traces:
each worker's batch and mean step time, and the epoch's samples/s; `benchmarks.scale`'s trace of the
windows between its policy's decisions, read the same way), and the same job is simulated with the
same policy, global batch and decision cadence (one decision an epoch, or a window). Leave one out: each
run is predicted from the laws of the others, so the check is of the simulator, not of a fit to the
run it predicts. Compared: the steady round time (the last half of the epochs, as the benchmark
measures it), the plan changes, and the final plan. Pure."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.simulation.engine import Scenario, simulate
from benchmarks.simulation.population import SpeedLaw

MIN_NOISE, MAX_NOISE = 0.02, 0.3
"""The step noise a replay assumes stays within these (σ of the lognormal)."""


@dataclass(frozen=True)
class Epoch:
    """One epoch of a real run: each worker's batch and mean step time (ms), and the mean round (ms)."""

    batches: Mapping[str, int]
    compute_ms: Mapping[str, float]
    round_ms: float


@dataclass(frozen=True)
class RealRun:
    """A real run's trace and what it was: the policy, B, the rounds an epoch, its steady fraction."""

    name: str
    policy: str
    global_batch: int
    rounds_per_epoch: int
    epochs: Sequence[Epoch]
    steady_fraction: float = 0.5

    @property
    def workers(self) -> list[str]:
        return sorted(self.epochs[0].batches, key=lambda k: int(k[1:]) if k[1:].isdigit() else k)


def read_runs(report: Mapping[str, Any], source: str) -> list[RealRun]:
    """The runs of a `benchmarks.hetero` throughput report (a result file's `report`) that have a
    per-epoch trace, or the run of a `benchmarks.scale` BSP report with its decisions' trace;
    ValueError for a report of another kind."""
    if "adjust_every" in report and "trace" in report:
        return [scale_run(report, source)]
    if report.get("kind") != "throughput" or report.get("mode") != "bsp":
        raise ValueError(f"{source}: not a benchmarks.hetero BSP throughput report (kind {report.get('kind')!r})")
    workload = report["workload"]
    size = next((int(a.split("=", 1)[1]) for a in workload.get("dataset_args", []) if a.startswith("size=")), None)
    total = int(workload["global_batch"])
    if size is None or workload.get("adjust_every") != "epoch":
        raise ValueError(f"{source}: the replay needs a synthetic dataset's size and a decision every epoch")
    runs = []
    for name, run in report["runs"].items():
        trace = run.get("trace") or []
        if len(trace) < 2 or name != run.get("controller"):  # a variant (the fast path, its trial): other costs
            continue
        epochs = [Epoch({k: int(b) for k, b in e["batch_sizes"].items()}, dict(e["compute_ms"]),
                        1000.0 * total / float(e["samples_per_s"])) for e in trace]
        runs.append(RealRun(f"{source}:{name}", str(run["controller"]), total, max(1, size // total), epochs,
                            float(workload.get("steady_fraction", 0.5))))
    return runs


def scale_run(report: Mapping[str, Any], source: str) -> RealRun:
    """A `benchmarks.scale` BSP run as a RealRun whose "epochs" are the windows between its policy's
    decisions (every `adjust_every` rounds; its trace: the plan in force, each worker's smoothed step
    time at the window's end and the mean round)."""
    trace = report["trace"]
    if report.get("mode") != "bsp" or len(trace) < 2:
        raise ValueError(f"{source}: a benchmarks.scale replay needs a BSP run with two decisions' trace at least")
    windows = [Epoch({k: int(b) for k, b in w["batch_sizes"].items()}, {k: float(v) for k, v in w["compute_ms"].items()},
                     float(w["round_ms"])) for w in trace]
    return RealRun(f"{source}:dynamic", "dynamic", int(report["global_batch"]), int(report["adjust_every"]), windows)


def fit_laws(runs: Sequence[RealRun]) -> dict[str, tuple[float, float]]:
    """Each worker's t = q·b + s by least squares over every epoch of `runs` (q > 0, s >= 0; one batch
    size: the line through the origin)."""
    laws = {}
    for k in runs[0].workers:
        points = [(e.batches[k], e.compute_ms[k]) for r in runs for e in r.epochs if e.batches.get(k)]
        b = np.array([p[0] for p in points], dtype=float)
        t = np.array([p[1] for p in points], dtype=float)
        q, s = (np.polyfit(b, t, 1) if len(set(b.tolist())) > 1 else (t.sum() / b.sum(), 0.0))
        if s < 0 or q <= 0:
            q, s = float((b * t).sum() / (b * b).sum()), 0.0
        laws[k] = (float(q), float(s))
    return laws


def step_noise(runs: Sequence[RealRun]) -> float:
    """The σ of one step's noise: how a worker's epoch means at one batch size spread within a run
    (about their median, so that neither the law's misfit nor a run's own load counts), times the
    square root of the rounds an epoch averages, within [MIN_NOISE, MAX_NOISE]."""
    residuals = []
    for r in runs:
        for k in r.workers:
            by_batch: dict[int, list[float]] = {}
            for e in r.epochs[1:]:
                if e.batches.get(k):
                    by_batch.setdefault(e.batches[k], []).append(e.compute_ms[k])
            for times in (t for t in by_batch.values() if len(t) > 1):
                centre = statistics.median(times)
                residuals += [math.log(t / centre) for t in times]
    sd = math.sqrt(statistics.fmean(x * x for x in residuals)) if residuals else 0.0
    return min(MAX_NOISE, max(MIN_NOISE, sd * math.sqrt(runs[0].rounds_per_epoch)))


def overhead_ms(runs: Sequence[RealRun], noise: float, seed: int = 0, draws: int = 256) -> float:
    """The round's time past its slowest worker's step, as the simulator counts it: the median over
    the epochs after the first of the round less the slowest mean step time, less what the simulated
    steps' noise adds to the slowest of them at those epochs' times (the mean over `draws` rounds),
    which a real epoch's round holds already."""
    rng = np.random.default_rng(seed)
    gaps, excess = [], []
    for e in (e for r in runs for e in r.epochs[1:]):
        times = np.array([e.compute_ms[k] for k, b in e.batches.items() if b])
        gaps.append(e.round_ms - times.max())
        noisy = times * np.exp(noise * rng.standard_normal((draws, len(times))))
        excess.append(float(noisy.max(axis=1).mean() - times.max()))
    return max(0.0, statistics.median(gaps) - statistics.fmean(excess))


def plan_changes(plans: Sequence[Mapping[str, int]]) -> int:
    return sum(1 for a, b in zip(plans, plans[1:]) if a != b)


def steady(values: Sequence[float], fraction: float) -> float:
    """The mean of the last `fraction` of `values` (at least one)."""
    return statistics.fmean(values[-max(1, round(fraction * len(values))):])


def replay(run: RealRun, others: Sequence[RealRun], seed: int = 0) -> dict[str, Any]:
    """`run` simulated from the laws, noise and overhead of `others`: both sides' steady round, plan
    changes and final plan, and the round's relative error."""
    laws = fit_laws(others)
    workers = run.workers
    epochs = len(run.epochs)
    noise = step_noise(others)
    scenario = Scenario(policy=run.policy, workers=len(workers), global_batch=run.global_batch,
                        rounds=epochs * run.rounds_per_epoch, adjust_every=run.rounds_per_epoch,
                        law=SpeedLaw(noise=noise, given=[laws[k] for k in workers]), seed=seed,
                        server_fixed_ms=overhead_ms(others, noise, seed), server_per_worker_ms=0.0)
    trace = simulate(scenario)
    names = trace.population.names if trace.population else []
    per_epoch = [statistics.fmean(trace.round_ms[i * run.rounds_per_epoch:(i + 1) * run.rounds_per_epoch])
                 for i in range(epochs)]
    sim_plans = [{workers[int(n[1:])]: int(b) for n, b in zip(names, plan)} for _, _, plan in trace.plans]
    real_plans = [dict(e.batches) for e in run.epochs]
    real_round, sim_round = steady([e.round_ms for e in run.epochs], run.steady_fraction), steady(per_epoch, run.steady_fraction)
    final_real, final_sim = real_plans[-1], sim_plans[-1]
    return {"run": run.name, "policy": run.policy, "laws": {k: [round(q, 4), round(s, 2)] for k, (q, s) in laws.items()},
            "noise": round(noise, 3), "overhead_ms": round(scenario.server_fixed_ms, 2),
            "real": {"round_ms": round(real_round, 2), "plan_changes": plan_changes(real_plans), "final_plan": final_real},
            "simulated": {"round_ms": round(sim_round, 2), "plan_changes": plan_changes(sim_plans), "final_plan": final_sim},
            "round_error": round(sim_round / real_round - 1.0, 4),
            "plan_error": round(max(abs(final_sim[k] - final_real[k]) for k in workers) / run.global_batch, 4)}


def leave_one_out(runs: Sequence[RealRun], seed: int = 0) -> list[dict[str, Any]]:
    """Every run replayed from the others' laws (runs of one setup: the same workers, B and policy)."""
    if len(runs) < 2:
        raise ValueError("the check needs two real runs of one setup at least")
    shape = {(tuple(r.workers), r.global_batch, r.policy) for r in runs}
    if len(shape) != 1:
        raise ValueError(f"the runs are not of one setup (workers, B, policy): {sorted(shape)}")
    return [replay(run, [o for o in runs if o is not run], seed) for run in runs]

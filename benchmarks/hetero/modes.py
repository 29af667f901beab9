"""What a benchmark run measures in each mode: throughput against the baselines and the time to a test
accuracy (a schedule's phases: :mod:`benchmarks.hetero.schedules`); each run's summary and the targets."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from benchmarks import analysis
from benchmarks.hetero.baselines import measure_ddp, measure_ideal
from benchmarks.hetero.compose import COMPOSE_SUFFIX, run_compose
from benchmarks.hetero.policies import compare, measured_costs, policy_record
from benchmarks.hetero.runs import CASES, RUN_VARIANTS, Run, run_cluster
from benchmarks.hetero.settings import Emulation, Settings


SOURCE = "issue targets (the HL8 anchors)"
ANCHORED = "hl8"
"""The profile the throughput anchors (over the ideal, over equal-batch DDP) were set on: OmniLearn's
HL8 figures say nothing of what another cluster's heterogeneity should gain."""
OVERLAP_SOURCE = "issue targets (communication overlapped with computation on the BSP PS path)"
POLICY_SOURCE = "issue targets (model-based split)"


BALANCE_TOLERANCE = 0.1


def summarize(s: Settings, emu: Emulation, run: Run, controller: str, ideal: dict | None, ddp: dict | None) -> dict:
    """The per-run JSON record (see analysis.py for the definitions)."""
    events = run.events
    epochs = analysis.of_kind(events, "epoch")
    summaries = analysis.of_kind(events, "summary")
    summary = summaries[-1] if summaries else {}
    rate, counted = analysis.steady_throughput(epochs, s.steady_fraction)
    last = epochs[-1] if epochs else {}
    exposed = _steady_exposed(epochs[-counted:] if counted else [])
    basis = "epoch" if s.adjust_every == "epoch" else "adjust"
    steady = analysis.to_steady(events, emu.names, basis=basis, tolerance=BALANCE_TOLERANCE)
    evals = analysis.of_kind(events, "eval")
    accuracy = summary.get("accuracy", evals[-1]["accuracy"] if evals else None)
    record: dict[str, Any] = {
        "controller": controller,
        "samples_per_s": None if rate is None else round(rate, 2),
        "steady_epochs": counted,
        "samples_per_s_overall": summary.get("samples_per_s"),
        "ratio_to_ideal": _ratio(rate, ideal),
        "ratio_to_ideal_together": _ratio(rate, (ideal or {}).get("together")),
        "ratio_to_ddp_uniform": _ratio(rate, ddp),
        "compute_spread": _round(analysis.spread(last.get("compute_ms"))),
        # BSP: ms per round each worker waited on communication, from the end of its compute to its next
        # fetch (the steady epochs' mean), and their mean over the workers
        "exposed_ms": exposed,
        "exposed_ms_mean": _round(sum(exposed.values()) / len(exposed), 2) if exposed else None,
        "adjustments_to_steady": steady["adjustments"],
        "plan_changes_to_steady": steady["plan_changes"],
        "steady_epoch": steady["steady_epoch"],
        "stayed_steady": steady["stayed_steady"],
        "steady_basis": steady["basis"],
        "adjustments": summary.get("adjustments"),
        "accuracy": accuracy,
        "batch_sizes": summary.get("batch_sizes") or last.get("batch_sizes"),
        "last_epoch_compute_ms": last.get("compute_ms"),
        "epochs": len(epochs),
        "train_wall_s": summary.get("wall_s"),
        "run_wall_s": run.wall_s,
        "trace": [{"epoch": e["epoch"], "samples_per_s": e["samples_per_s"], "batch_sizes": e["batch_sizes"],
                   "compute_ms": e["compute_ms"]} for e in epochs],
    }
    paths = analysis.of_kind(events, "path")
    if paths:  # --allreduce auto: the path it took, and on CPU workers the trial's steps and rates
        record["path"] = [{k: p.get(k) for k in ("allreduce", "why", "rates", "step")} for p in paths]
    if controller in ("dynamic", "model", "auto"):
        record["policy"] = policy_record(events)
    if s.mode == "asp":
        # max/min pushes per worker in the last epoch; null when a worker made none (unbounded)
        record["update_skew"] = _round(analysis.spread(last.get("updates")))
        record["last_epoch_updates"] = last.get("updates")
        record["update_counts"] = summary.get("update_counts")
    return record


def _steady_exposed(epochs: list[analysis.Event]) -> dict[str, float]:
    """Each worker's mean exposed communication per round over these epochs' records."""
    per_worker: dict[str, list[float]] = {}
    for epoch in epochs:
        for name, ms in (epoch.get("exposed_ms") or {}).items():
            per_worker.setdefault(name, []).append(float(ms))
    return {name: round(sum(v) / len(v), 2) for name, v in sorted(per_worker.items())}


def overlap_comparison(runs: dict[str, Any], ddp_split: dict | None) -> tuple[dict[str, Any], list[dict]]:
    """dynamic (buckets pushed during backward) against dynamic_no_overlap (the serial path) and DDP at
    dynamic's final split, from the same run: the ratios and the issue's targets."""
    dyn, serial = runs.get("dynamic", {}), runs.get("dynamic_no_overlap", {})
    rate, serial_rate = dyn.get("samples_per_s"), serial.get("samples_per_s")
    exposed, serial_exposed = dyn.get("exposed_ms_mean"), serial.get("exposed_ms_mean")
    speedup = round(rate / serial_rate, 4) if rate and serial_rate else None
    exposed_ratio = round(exposed / serial_exposed, 4) if exposed is not None and serial_exposed else None
    of_split = _ratio(rate, ddp_split)
    comparison = {"overlap_over_no_overlap": speedup, "exposed_over_no_overlap": exposed_ratio,
                  "exposed_ms_mean": exposed, "no_overlap_exposed_ms_mean": serial_exposed,
                  "overlap_over_ddp_split": of_split, "no_overlap_over_ddp_split": _ratio(serial_rate, ddp_split),
                  "overlap_ratio_to_ideal": dyn.get("ratio_to_ideal"),
                  "no_overlap_ratio_to_ideal": serial.get("ratio_to_ideal")}
    targets = [
        analysis.target("BSP dynamic (overlap) ratio_to_ideal", dyn.get("ratio_to_ideal"), ">=", 0.88, OVERLAP_SOURCE),
        analysis.target("BSP dynamic overlap over --no-overlap", speedup, ">=", 1.08, OVERLAP_SOURCE),
        analysis.target("BSP dynamic exposed ms, overlap over --no-overlap", exposed_ratio, "<=", 0.5, OVERLAP_SOURCE),
        analysis.target("BSP dynamic (overlap) over DDP at its final split", of_split, ">=", 1.1, OVERLAP_SOURCE),
    ]
    return comparison, targets


def bracketed(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """One DDP baseline from its measurements around the runs: the last one's record, with the mean
    rate of all of them (`samples_per_s`) and each one's (`samples`). DDP at the same split moved by
    up to 12% between runs minutes apart on the 2-core VM; measured on either side of the runs it
    compares with, one baseline's swing weighs half."""
    rates = [m["samples_per_s"] for m in samples]
    return {**samples[-1], "samples_per_s": round(sum(rates) / len(rates), 1), "samples": rates}


def _timed(timings: dict[str, float], key: str, measure: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`measure(*args, **kwargs)`, its wall seconds recorded as `timings[key]`."""
    t = time.monotonic()
    result = measure(*args, **kwargs)
    timings[key] = round(time.monotonic() - t, 1)
    return result


def _ratio(rate: float | None, baseline: dict | None) -> float | None:
    if rate is None or not baseline or not baseline.get("samples_per_s"):
        return None
    return round(rate / baseline["samples_per_s"], 4)


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def bench_throughput(s: Settings, emu: Emulation, report: dict) -> None:
    """BSP or ASP at a fixed profile: baselines, then one run per controller."""
    timings = report["timings_s"]
    ideal = ddp = None
    if s.baselines:
        ideal = _timed(timings, "ideal", measure_ideal, s, emu)
        ddp = _timed(timings, "ddp_uniform", measure_ddp, s, emu, ideal)
    report["ideal"], report["ddp_uniform"] = ideal, ddp
    runs: dict[str, Any] = {}
    events_of: dict[str, list[dict]] = {}
    split_samples: list[dict] = []  # ddp_split, measured after the dynamic run and again after the last run
    split_wanted = s.baselines and s.mode == "bsp"
    for name in s.controllers:
        controller, extra = RUN_VARIANTS.get(name, (name, []))
        t = time.monotonic()
        if name.endswith(COMPOSE_SUFFIX):
            run = run_compose(s, emu, f"{s.mode}-{name}", controller, extra)
        else:
            run = run_cluster(s, emu, f"{s.mode}-{name}", controller, extra_server_args=extra)
        runs[name] = summarize(s, emu, run, controller, ideal, ddp)
        events_of[name] = run.events
        if name.endswith(COMPOSE_SUFFIX):
            runs[name]["limiting"] = run.limiting
        if name == "dynamic_no_lr_scaling":
            runs[name]["lr_scaling"] = False
        timings[f"run_{name}"] = round(time.monotonic() - t, 1)
        if split_wanted and name == "dynamic" and runs[name].get("batch_sizes") and name != s.controllers[-1]:
            split_samples.append(_timed(timings, "ddp_split_first", measure_ddp, s, emu, ideal,
                                        split=runs["dynamic"]["batch_sizes"], name="ddp_split_first"))
    report["runs"] = runs
    ddp_split = None
    if split_wanted and runs.get("dynamic", {}).get("batch_sizes"):
        split_samples.append(_timed(timings, "ddp_split", measure_ddp, s, emu, ideal, split=runs["dynamic"]["batch_sizes"]))
        ddp_split = bracketed(split_samples)
        for record in runs.values():
            record["ratio_to_ddp_split"] = _ratio(record.get("samples_per_s"), ddp_split)
    fast_plan = runs.get("dynamic_allreduce", {}).get("batch_sizes")
    if split_wanted and fast_plan:  # the fast path against DDP at the split it settled on itself
        report["ddp_fast_split"] = _timed(timings, "ddp_fast_split", measure_ddp, s, emu, ideal, split=fast_plan,
                                          name="ddp_fast_split")
        runs["dynamic_allreduce"]["ratio_to_ddp_own_split"] = _ratio(runs["dynamic_allreduce"].get("samples_per_s"),
                                                                     report["ddp_fast_split"])
    report["ddp_split"] = ddp_split
    report["compose_vs_emulator"] = {  # each run in containers against the same controller's on the emulator
        name: _ratio(r.get("samples_per_s"), runs.get(name.removesuffix(COMPOSE_SUFFIX)))
        for name, r in runs.items() if name.endswith(COMPOSE_SUFFIX)
    } or None
    dyn = runs.get("dynamic", {})
    model_runs = [name for name in runs if RUN_VARIANTS.get(name, (name, []))[0] == "model"]
    costs = measured_costs(events_of[model_runs[0]]) if model_runs and s.mode == "bsp" else None
    if costs is not None:
        report["policy_comparison"] = compare(*costs, s.workload.global_batch, 1,
                                              {name: r["batch_sizes"] or {} for name, r in runs.items()})
    if s.profile.name in CASES:
        report["targets"] = case_targets(s.profile.name, runs, report.get("policy_comparison"))
    elif s.mode == "bsp":
        report["targets"] = bsp_targets(s.profile.name, runs)
        if "dynamic_no_overlap" in runs:
            report["overlap"], targets = overlap_comparison(runs, ddp_split)
            report["targets"] += targets
    else:
        skew = analysis.target(f"{s.profile.name} ASP dynamic update_skew", dyn.get("update_skew"), "<=", 1.3, SOURCE)
        if skew["value"] is None and 0 in (dyn.get("last_epoch_updates") or {}).values():
            skew["pass"] = False  # a worker made no update at all in the last epoch: unbounded skew
        report["targets"] = [skew]
        report["asp_lr_scaling"] = {  # final accuracy of dynamic with and without eta_k = eta*b_k/B (null: not run)
            "accuracy_with": dyn.get("accuracy"),
            "accuracy_without": runs.get("dynamic_no_lr_scaling", {}).get("accuracy"),
        }


def bsp_targets(profile: str, runs: dict[str, Any]) -> list[dict]:
    """The BSP throughput targets of `runs` (their ratios already set): dynamic's decisions to steady;
    on HL8, whose figures the anchors are, dynamic against the ideal and equal-batch DDP; with
    dynamic_allreduce, the fast path (DDP plus a plan) against DDP at the same split, and the best of
    the two paths against ddp_split."""
    dyn = runs.get("dynamic", {})
    targets = [analysis.target(f"{profile} BSP dynamic adjustments_to_steady", dyn.get("adjustments_to_steady"),
                               "<=", 3, SOURCE)]
    if profile == ANCHORED:
        targets = [
            analysis.target(f"{profile} BSP dynamic ratio_to_ideal", dyn.get("ratio_to_ideal"), ">=", 0.85, SOURCE),
            analysis.target(f"{profile} BSP dynamic ratio_to_ddp_uniform", dyn.get("ratio_to_ddp_uniform"), ">=", 2.5,
                            SOURCE),
            *targets,
        ]
    fast = runs.get("dynamic_allreduce", {}).get("ratio_to_ddp_split")
    if fast is None:
        return targets
    best = max(fast, dyn.get("ratio_to_ddp_split") or 0.0)
    return targets + [
        analysis.target(f"{profile} BSP fast path (dynamic_allreduce) over ddp_split", fast, ">=", 0.98, SOURCE),
        analysis.target(f"{profile} BSP fast path over DDP at the fast path's own final plan",
                        runs["dynamic_allreduce"].get("ratio_to_ddp_own_split"), ">=", 0.98, SOURCE),
        analysis.target(f"{profile} BSP best of dynamic and dynamic_allreduce over ddp_split", best, ">=", 1.0, SOURCE),
    ]


def case_targets(case: str, runs: dict[str, Any], comparison: dict[str, Any] | None) -> list[dict]:
    """The issue's targets for a batch-policy case (model against dynamic, both against the optimum)."""
    model, dyn = runs.get("model", {}), runs.get("dynamic", {})
    rate = model.get("samples_per_s")
    ratio = None if not rate or not dyn.get("samples_per_s") else round(rate / dyn["samples_per_s"], 4)
    policy = model.get("policy", {})
    of_optimum = ((comparison or {}).get("runs", {}).get("model") or {}).get("of_optimum")
    targets = [
        analysis.target(f"{case}: model samples/s over dynamic", ratio, ">=", 1.1 if case == "quickstart" else 1.0,
                        POLICY_SOURCE),
        analysis.target(f"{case}: model's final plan of the optimum round", of_optimum, ">=", 0.95, POLICY_SOURCE),
        analysis.target(f"{case}: model decisions after the probe rounds (besides re-probes of a parked worker)",
                        policy.get("decisions_after_probe_besides_reprobes"), "<=", 1, POLICY_SOURCE),
        analysis.target(f"{case}: model busy-time spread above the minimum batch",
                        policy.get("busy_spread_above_min_batch"), "<=", 1.1, POLICY_SOURCE),
        analysis.target(f"{case}: model median |predicted - measured| round", policy.get("prediction_error_median"),
                        "<=", 0.05, POLICY_SOURCE),
    ]
    if case == "hl8-fixed":
        decisions = dyn.get("policy", {}).get("decisions")
        fewer = None if decisions is None or policy.get("decisions") is None else policy["decisions"] - decisions
        targets.append(analysis.target(f"{case}: model decisions minus dynamic's", fewer, "<=", -1, POLICY_SOURCE))
    return targets


def bench_tta(s: Settings, emu: Emulation, report: dict) -> None:
    """Time to a test accuracy, uniform against dynamic; each run stops once it gets there."""
    assert s.tta is not None
    goal = s.tta
    runs: dict[str, Any] = {}
    for name in s.controllers:
        def on_event(cluster: Any, event: dict, run: Run) -> bool:
            return event.get("event") == "eval" and event.get("accuracy") is not None and event["accuracy"] >= goal

        t = time.monotonic()
        run = run_cluster(s, emu, f"{s.mode}-tta-{name}", name, on_event=on_event)
        record = summarize(s, emu, run, name, None, None)
        reached = analysis.first_reaching(analysis.of_kind(run.events, "eval"), goal)
        record["target_accuracy"] = goal
        record["stopped_at_target"] = run.stopped_early
        record["time_to_accuracy_s"] = None if reached is None else reached["wall_s"]
        # epoch 1 runs the same (uniform) plan under both controllers and also holds the workers'
        # set-up after Join (data and model built, first pull): the time after it isolates the plans
        first = analysis.of_kind(run.events, "epoch")[:1]
        record["time_to_accuracy_after_epoch1_s"] = (
            None if reached is None or not first or reached["epoch"] <= 1
            else round(reached["wall_s"] - first[0]["wall_s"], 3))
        # from the end of round 0: without the workers' set-up after Join (building data and model
        # under the quota, and the first step; the same for every controller)
        record["time_to_accuracy_from_first_round_s"] = analysis.time_to_accuracy(
            analysis.accuracy_curve(run.events), goal) if analysis.of_kind(run.events, "first_round") else None
        record["epochs_to_accuracy"] = None if reached is None else reached["epoch"]
        record["best_accuracy"] = max((e["accuracy"] for e in analysis.of_kind(run.events, "eval")), default=None)
        runs[name] = record
        report["timings_s"][f"run_{name}"] = round(time.monotonic() - t, 1)
    report["runs"] = runs
    uni = runs.get("uniform", {}).get("time_to_accuracy_s")
    dyn = runs.get("dynamic", {}).get("time_to_accuracy_s")
    ratio = None if not uni or dyn is None else round(dyn / uni, 4)
    uni1 = runs.get("uniform", {}).get("time_to_accuracy_after_epoch1_s")
    dyn1 = runs.get("dynamic", {}).get("time_to_accuracy_after_epoch1_s")
    unif = runs.get("uniform", {}).get("time_to_accuracy_from_first_round_s")
    dynf = runs.get("dynamic", {}).get("time_to_accuracy_from_first_round_s")
    ratio_f = None if not unif or dynf is None else round(dynf / unif, 4)
    report["tta"] = {"target_accuracy": goal, "uniform_s": uni, "dynamic_s": dyn, "dynamic_over_uniform": ratio,
                     "dynamic_over_uniform_from_first_round": ratio_f,
                     "dynamic_over_uniform_after_epoch1": None if not uni1 or dyn1 is None else round(dyn1 / uni1, 4)}
    report["targets"] = [
        analysis.target(f"TTA({goal}) dynamic / uniform, from job start", ratio, "<=", 0.5, SOURCE),
        analysis.target(f"TTA({goal}) dynamic / uniform, from the end of round 0", ratio_f, "<=", 0.5, SOURCE),
    ]

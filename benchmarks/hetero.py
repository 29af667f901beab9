"""Heterogeneity benchmark: our parameter server against the ideal and against equal-batch DDP.

``python -m benchmarks.hetero --profile hl8 --mode bsp --json`` emulates a heterogeneous cluster on
this machine (one CPU-quota cgroup per worker, the profile's ratios scaled to ``--cpu-budget``)
and measures, in one run, under the same quotas, with the same model and global batch:

* ``ideal``: each worker alone under its quota (``benchmarks.solo``: fetch, forward, backward,
  SGD step; one torch thread; no server), one after another. Their sum is what a perfect balancer
  could reach. ``ideal.together``: the same solo runs started all at once (a diagnostic: how much
  co-running processes slow each other down on this machine; ``ratio_to_ideal_together``).
* ``ddp_uniform``: PyTorch DistributedDataParallel (gloo) with equal batches ``B/K``, one process
  per worker cgroup (``benchmarks.ddp_baseline``).
* our BSP server (``ps-server`` + ``ps-worker`` via :class:`deploy.launcher.LocalCluster`) with the
  ``uniform``, ``static`` (declared cores = the shares) and ``dynamic`` controllers.

``--mode asp`` runs ASP (Table I's ASP column; the server gets its scaled share too) with the
``uniform`` and ``dynamic`` controllers and ``dynamic`` without LR scaling, and reports the update
skew. ``--schedule dynamic`` steps the quotas through the schedule's phases (rewritten live at the
epoch boundaries) and reports the decisions needed to be steady again after each change.
``--tta TARGET`` times ``uniform`` and ``dynamic`` to a test accuracy on digits.

Progress goes to stderr; stdout gets the JSON report (with ``--json``) followed by a markdown table.
Every process and cgroup this starts is removed on every exit path (Ctrl-C and SIGTERM included).
Definitions of the reported numbers: ``benchmarks/analysis.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks import analysis
from benchmarks.compose_runs import COMPOSE_SUFFIX, run_compose
from benchmarks.report_output import print_report, save_report
from benchmarks.workload import Workload, spawn, stop
from deploy.cgroups import CgroupBackend, CpuLimiter, detect_backend, slowdown_factors
from deploy.profiles import (
    Profile,
    Schedule,
    default_cpu_budget,
    load_profile,
    load_schedule,
    quota_period_us,
    scale,
)
from ps.arg_types import positive_float, positive_int

SOURCE = "issue targets (design.md §7 anchors)"
POLL_S = 0.1
BALANCE_TOLERANCE = 0.1


def log(message: str) -> None:
    """One progress line on stderr."""
    print(f"[hetero] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------ settings
@dataclass
class Settings:
    """Everything a benchmark run needs, resolved from the command line."""

    mode: str
    profile: Profile
    schedule: Schedule | None
    tta: float | None
    workload: Workload
    epochs: int
    controllers: list[str]
    adjust_every: str
    cpu_budget: float
    server_share: float | None
    period_us: int | None
    limiter: str
    baselines: bool
    solo_seconds: float
    solo_warmup: int
    solo_min_steps: int
    ddp_seconds: float
    ddp_warmup: int
    ddp_min_steps: int
    steady_fraction: float
    server_args: list[str]
    run_timeout: float
    workdir: Path
    tiny: bool


@dataclass
class Emulation:
    """How heterogeneity is applied: per-worker shares, the server's share, the CFS period, the backend."""

    names: list[str]
    shares: list[float]
    server_share: float | None
    period_us: int
    backend: CgroupBackend | None
    limiter: str  # what LocalCluster is told: "cgroup" or "slowdown"

    @property
    def limiting(self) -> str:
        return f"cgroup-v{self.backend.version}" if self.backend is not None else "slowdown"

    @property
    def slowdowns(self) -> list[float]:
        return slowdown_factors(self.shares)


def resolve_emulation(s: Settings) -> Emulation:
    """Shares from the profile (or the schedule's first phase), the period, and the limiter backend."""
    phases = list(s.schedule.phases) if s.schedule is not None else [s.profile]
    all_shares = [scale(p, s.mode, s.cpu_budget) for p in phases]
    shares = all_shares[0]
    allocation = phases[0].allocation(s.mode)
    server_share = s.server_share
    if server_share is None and s.mode == "asp" and allocation.server is not None:
        server_share = allocation.server * s.cpu_budget / sum(allocation.workers)
    every_share = [x for phase in all_shares for x in phase] + ([server_share] if server_share else [])
    period = s.period_us if s.period_us is not None else quota_period_us(every_share)
    backend = None
    if s.limiter != "slowdown":
        backend = detect_backend()
        if backend is None and s.limiter == "cgroup":
            raise SystemExit("hetero: error: --limiter cgroup: no writable cgroup CPU controller (run as root on Linux)")
    if backend is None and s.schedule is not None:
        raise SystemExit("hetero: error: --schedule rewrites quotas while workers run: it needs a writable cgroup "
                         "CPU controller (the slowdown fallback is fixed at start)")
    names = [f"w{k}" for k in range(len(shares))]
    return Emulation(names, shares, server_share, period, backend, "cgroup" if backend is not None else "slowdown")


def static_split(shares: Sequence[float], total: int) -> list[int]:
    """Integer batches proportional to ``shares`` summing to ``total`` (the static plan, Eq. 4a)."""
    from ps.controller import largest_remainder

    plan = largest_remainder({str(k): s for k, s in enumerate(shares)}, total)
    return [max(1, plan[str(k)]) for k in range(len(shares))]


# ---------------------------------------------------------------------------- children in cgroups
@contextlib.contextmanager
def limiters(emu: Emulation, prefix: str) -> Any:
    """One reserved cgroup per worker (None each under the slowdown fallback); all closed on exit."""
    made: list[CpuLimiter] = []
    try:
        if emu.backend is not None:
            for name, share in zip(emu.names, emu.shares, strict=True):
                made.append(CpuLimiter.create(f"{prefix}-{name}", share, emu.period_us, run_id="hetero-bench",
                                              backend=emu.backend, reserve=True))
            yield made
        else:
            yield [None] * len(emu.names)
    finally:
        for limiter in made:
            with contextlib.suppress(Exception):
                limiter.close()


def _with_death_signal(preexec: Callable[[], None] | None) -> Callable[[], None]:
    """Add 'SIGKILL me when my parent dies' (Linux) to a child's preexec step."""
    import ctypes
    import ctypes.util
    import signal

    name = ctypes.util.find_library("c")
    prctl = ctypes.CDLL(name, use_errno=True).prctl if name else None

    def run() -> None:
        if prctl is not None:
            prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        if preexec is not None:
            preexec()

    return run


def _solo_argv(s: Settings, batches: Sequence[int], slowdowns: Sequence[float]) -> list[str]:
    w = s.workload
    return [
        "-m", "benchmarks.solo", *w.cli_args(), "--lr", str(w.lr), "--momentum", str(w.momentum),
        "--batch", ",".join(str(b) for b in batches), "--slowdown", ",".join(repr(f) for f in slowdowns),
        "--warmup", str(s.solo_warmup), "--seconds", str(s.solo_seconds), "--min-steps", str(s.solo_min_steps),
    ]


def _run_child(argv: list[str], preexec: Callable[[], None] | None, logfile: Path, timeout: float) -> list[dict]:
    """Run one benchmark child to completion; its JSON stdout lines (RuntimeError on failure)."""
    return _run_children([(argv, preexec, logfile)], timeout)[0]


def _run_children(
    children: Sequence[tuple[list[str], Callable[[], None] | None, Path]], timeout: float
) -> list[list[dict]]:
    """Start benchmark children (argv, preexec, log file) at once and run them to completion; each
    one's JSON stdout lines. On any failure every child is stopped and RuntimeError raised."""
    procs = [spawn(argv, preexec=_with_death_signal(preexec), log=logfile) for argv, preexec, logfile in children]
    deadline = time.monotonic() + timeout
    results = []
    try:
        for proc, (argv, _, logfile) in zip(procs, children, strict=True):
            try:
                out, _ = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"{argv[1]} did not finish within {timeout:.0f} s (log: {logfile})") from None
            if proc.returncode != 0:
                tail = logfile.read_text(encoding="utf-8", errors="replace")[-1500:]
                raise RuntimeError(f"{argv[1]} exited with {proc.returncode}:\n{tail}")
            results.append([json.loads(line) for line in out.splitlines() if line.startswith("{")])
    finally:
        stop(procs)
        for proc in procs:
            if proc.stdout:
                proc.stdout.close()
    return results


def measure_ideal(s: Settings, emu: Emulation) -> dict[str, Any]:
    """Each worker alone under its quota, one after another, at its share of B (the static split)."""
    batches = static_split(emu.shares, s.workload.global_batch)
    per_worker: dict[str, Any] = {}
    workdir = s.workdir / "ideal"
    workdir.mkdir(parents=True, exist_ok=True)
    if emu.backend is None:
        log(f"ideal: solo runs of {', '.join(emu.names)} in one process (software slowdowns {emu.slowdowns})")
        results = _run_child(_solo_argv(s, batches, emu.slowdowns), None, workdir / "solo.log", s.run_timeout)
        for name, share, result in zip(emu.names, emu.shares, results, strict=True):
            per_worker[name] = {"share": share, **result}
    else:
        with limiters(emu, "solo") as groups:
            for name, share, batch, group in zip(emu.names, emu.shares, batches, groups, strict=True):
                log(f"ideal: {name} alone, {share:.4g} core, batch {batch} ...")
                (result,) = _run_child(_solo_argv(s, [batch], [1.0]), group.preexec, workdir / f"solo-{name}.log",
                                       s.run_timeout)
                per_worker[name] = {"share": share, **result}
                group.close()  # done with this worker's group; the next solo gets its own
    for name, r in per_worker.items():
        log(f"ideal: {name}: {r['samples_per_s']:.1f} samples/s (batch {r['batch']}, {r['step_ms']:.1f} ms/step)")
    total = sum(r["samples_per_s"] for r in per_worker.values())
    log(f"ideal: sum {total:.1f} samples/s")
    ideal: dict[str, Any] = {
        "samples_per_s": round(total, 2), "per_worker": per_worker,
        "note": "each worker alone under its quota at its static share of the global batch; sum = perfect balance",
    }
    together = measure_ideal_together(s, emu, batches)
    if together is not None:
        ideal["together"] = together
    return ideal


def measure_ideal_together(s: Settings, emu: Emulation, batches: Sequence[int]) -> dict[str, Any] | None:
    """The same solo runs started all at once, each in its own cgroup: still no server and no waiting,
    but the workers slow each other down as they do in a cluster on this machine (shared cores,
    caches, memory bandwidth), which the one-at-a-time ideal leaves out. A diagnostic beside the
    ideal, not a replacement. None under the slowdown fallback, whose solos share one process."""
    if emu.backend is None:
        return None
    workdir = s.workdir / "ideal"
    log(f"ideal, all at once: {', '.join(emu.names)} ...")
    with limiters(emu, "together") as groups:
        children = [(_solo_argv(s, [batch], [1.0]), group.preexec, workdir / f"together-{name}.log")
                    for name, batch, group in zip(emu.names, batches, groups, strict=True)]
        results = _run_children(children, s.run_timeout)
    per_worker = {name: result["samples_per_s"] for name, (result,) in zip(emu.names, results, strict=True)}
    total = sum(per_worker.values())
    log(f"ideal, all at once: sum {total:.1f} samples/s ({', '.join(f'{n} {r:.1f}' for n, r in per_worker.items())})")
    return {"samples_per_s": round(total, 2), "per_worker": per_worker,
            "note": "the solo runs started together, each under its quota: co-running processes share the machine"}


def measure_ddp(s: Settings, emu: Emulation, ideal: dict[str, Any] | None) -> dict[str, Any]:
    """DDP with equal batches B/K, one rank per worker cgroup; steps sized to last about ddp_seconds."""
    from benchmarks.ddp_baseline import run_ddp

    k = len(emu.names)
    batch = max(1, s.workload.global_batch // k)
    steps = s.ddp_min_steps
    if ideal is not None and not s.tiny:
        # the slowest worker sets the pace of an equal split; its solo rate predicts the step time
        rates = [ideal["per_worker"][n]["samples_per_s"] for n in emu.names]
        step_s = max(batch / r for r in rates if r > 0)
        steps = max(s.ddp_min_steps, min(200, math.ceil(s.ddp_seconds / step_s)))
    log(f"ddp_uniform: {k} ranks x batch {batch}, {s.ddp_warmup} warm-up + {steps} timed steps ...")
    with limiters(emu, "ddp") as groups:
        preexecs = [_with_death_signal(g.preexec if g is not None else None) for g in groups]
        slowdowns = emu.slowdowns if emu.backend is None else [1.0] * k
        result = run_ddp(s.workload, batch, preexecs, slowdowns, warmup=s.ddp_warmup, steps=steps,
                         workdir=s.workdir / "ddp", timeout_s=s.run_timeout)
    log(f"ddp_uniform: {result['samples_per_s']:.1f} samples/s ({result['step_ms']:.1f} ms/step)")
    return result


# ------------------------------------------------------------------------------- our server runs
@dataclass
class Run:
    """One LocalCluster run: its metrics events, phase switches and timing."""

    name: str
    events: list[dict] = field(default_factory=list)
    switches: list[dict] = field(default_factory=list)
    stopped_early: bool = False
    wall_s: float = 0.0
    limiting: str = ""


def server_argv(s: Settings, controller: str, extra: Sequence[str] = ()) -> list[str]:
    w = s.workload
    return [
        "--mode", s.mode, "--workers", str(len(s.profile.allocation(s.mode).workers)), *w.cli_args(),
        "--global-batch", str(w.global_batch), "--lr", str(w.lr), "--momentum", str(w.momentum),
        "--epochs", str(s.epochs), "--controller", controller, "--adjust-every", s.adjust_every,
        *s.server_args, *extra,
    ]


def run_cluster(
    s: Settings,
    emu: Emulation,
    name: str,
    controller: str,
    *,
    extra_server_args: Sequence[str] = (),
    on_event: Callable[[Any, dict, Run], bool] | None = None,
) -> Run:
    """Run ps-server and its workers to the end (or until ``on_event`` returns True); all cleaned up."""
    from deploy.launcher import LocalCluster, WorkerSpec

    # static declares each worker's cores (Eq. 4a); the launcher also passes them, this makes it explicit
    workers = [
        WorkerSpec(n, share, extra_args=("--cores", repr(float(share))) if controller == "static" else ())
        for n, share in zip(emu.names, emu.shares, strict=True)
    ]
    run = Run(name)
    workdir = s.workdir / "runs" / name
    started = time.monotonic()
    log(f"{name}: starting ps-server ({s.mode}, {controller}) and {len(workers)} workers ...")
    with LocalCluster(server_argv(s, controller, extra_server_args), workers, workdir, period_us=emu.period_us,
                      limiter=emu.limiter, server_share=emu.server_share, run_id="hetero-bench") as cluster:
        cluster.start()
        run.limiting = cluster.limiting
        seen = 0
        deadline = time.monotonic() + s.run_timeout
        while True:
            cluster.check_workers()
            code = cluster.poll()
            events = cluster.events()
            stop_now = finished = False
            for event in events[seen:]:
                _progress(name, event, s.epochs)
                if on_event is not None and on_event(cluster, event, run):
                    stop_now = True
                # the summary is the last event: the metrics are complete, no need to watch the shutdown
                finished = finished or event.get("event") == "summary"
            seen = len(events)
            if stop_now:
                run.stopped_early = True
                break
            if finished:
                break
            if code is not None:
                if code != 0:
                    tail = (workdir / "server.log").read_text(encoding="utf-8", errors="replace")[-1500:]
                    raise RuntimeError(f"{name}: ps-server exited with {code}:\n{tail}")
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: not finished within {s.run_timeout:.0f} s (logs: {workdir})")
            time.sleep(POLL_S)
        run.events = cluster.events()
    run.wall_s = round(time.monotonic() - started, 2)
    return run


def _progress(name: str, event: dict, epochs: int) -> None:
    kind = event.get("event")
    if kind == "epoch":
        batches = " ".join(f"{k}={v}" for k, v in event["batch_sizes"].items())
        times = " ".join(f"{k}={v:.0f}" for k, v in event["compute_ms"].items())
        log(f"{name}: epoch {event['epoch']}/{epochs}: {event['samples_per_s']} samples/s | batch {batches} | ms {times}")
    elif kind == "adjust" and event.get("changed") and event.get("epoch", 0) > 0:
        log(f"{name}: plan " + " ".join(f"{k}={v}" for k, v in event["batch_sizes"].items()))
    elif kind == "summary":
        log(f"{name}: done: {event['samples_per_s']} samples/s overall, accuracy {event['accuracy']}")


def summarize(s: Settings, emu: Emulation, run: Run, controller: str, ideal: dict | None, ddp: dict | None) -> dict:
    """The per-run JSON record (see analysis.py for the definitions)."""
    events = run.events
    epochs = analysis.of_kind(events, "epoch")
    summaries = analysis.of_kind(events, "summary")
    summary = summaries[-1] if summaries else {}
    rate, counted = analysis.steady_throughput(epochs, s.steady_fraction)
    last = epochs[-1] if epochs else {}
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
    if s.mode == "asp":
        # max/min pushes per worker in the last epoch; null when a worker made none (unbounded)
        record["update_skew"] = _round(analysis.spread(last.get("updates")))
        record["last_epoch_updates"] = last.get("updates")
        record["update_counts"] = summary.get("update_counts")
    return record


def _ratio(rate: float | None, baseline: dict | None) -> float | None:
    if rate is None or not baseline or not baseline.get("samples_per_s"):
        return None
    return round(rate / baseline["samples_per_s"], 4)


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


# ------------------------------------------------------------------------------------- the modes
def bench_throughput(s: Settings, emu: Emulation, report: dict) -> None:
    """BSP or ASP at a fixed profile: baselines, then one run per controller."""
    timings = report["timings_s"]
    ideal = ddp = None
    if s.baselines:
        t = time.monotonic()
        ideal = measure_ideal(s, emu)
        timings["ideal"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        ddp = measure_ddp(s, emu, ideal)
        timings["ddp_uniform"] = round(time.monotonic() - t, 1)
    report["ideal"], report["ddp_uniform"] = ideal, ddp
    runs: dict[str, Any] = {}
    for name in s.controllers:
        controller, extra = RUN_VARIANTS.get(name, (name, []))
        t = time.monotonic()
        if name.endswith(COMPOSE_SUFFIX):
            run = run_compose(s, emu, f"{s.mode}-{name}", controller, extra)
        else:
            run = run_cluster(s, emu, f"{s.mode}-{name}", controller, extra_server_args=extra)
        runs[name] = summarize(s, emu, run, controller, ideal, ddp)
        if name.endswith(COMPOSE_SUFFIX):
            runs[name]["limiting"] = run.limiting
        if name == "dynamic_no_lr_scaling":
            runs[name]["lr_scaling"] = False
        timings[f"run_{name}"] = round(time.monotonic() - t, 1)
    report["runs"] = runs
    report["compose_vs_emulator"] = {  # each run in containers against the same controller's on the emulator
        name: _ratio(r.get("samples_per_s"), runs.get(name.removesuffix(COMPOSE_SUFFIX)))
        for name, r in runs.items() if name.endswith(COMPOSE_SUFFIX)
    } or None
    dyn = runs.get("dynamic", {})
    if s.mode == "bsp":
        report["targets"] = [
            analysis.target(f"{s.profile.name} BSP dynamic ratio_to_ideal", dyn.get("ratio_to_ideal"), ">=", 0.85, SOURCE),
            analysis.target(f"{s.profile.name} BSP dynamic ratio_to_ddp_uniform", dyn.get("ratio_to_ddp_uniform"), ">=", 2.5,
                            SOURCE),
            analysis.target("dynamic adjustments_to_steady", dyn.get("adjustments_to_steady"), "<=", 3, SOURCE),
        ]
    else:
        skew = analysis.target(f"{s.profile.name} ASP dynamic update_skew", dyn.get("update_skew"), "<=", 1.3, SOURCE)
        if skew["value"] is None and 0 in (dyn.get("last_epoch_updates") or {}).values():
            skew["pass"] = False  # a worker made no update at all in the last epoch: unbounded skew
        report["targets"] = [skew]
        report["asp_lr_scaling"] = {  # final accuracy of dynamic with and without eta_k = eta*b_k/B (null: not run)
            "accuracy_with": dyn.get("accuracy"),
            "accuracy_without": runs.get("dynamic_no_lr_scaling", {}).get("accuracy"),
        }


def bench_schedule(s: Settings, emu: Emulation, report: dict) -> None:
    """Dynamic heterogeneity: quotas rewritten at the schedule's epoch boundaries, one run per controller."""
    assert s.schedule is not None
    schedule = s.schedule
    every = int(schedule.interval)
    phase_shares = [scale(p, s.mode, s.cpu_budget) for p in schedule.phases]
    runs: dict[str, Any] = {}
    worst: list[int | None] = []
    for name in s.controllers:
        current = {"phase": 0}

        def on_event(cluster: Any, event: dict, run: Run, current: dict = current) -> bool:
            if event.get("event") != "epoch":
                return False
            phase = schedule.phase_index(int(event["epoch"]))
            if phase != current["phase"] and int(event["epoch"]) < s.epochs:
                lag = time.time() - float(event["time"])
                cluster.set_shares(phase_shares[phase])
                current["phase"] = phase
                run.switches.append({"phase": phase, "profile": schedule.phases[phase].name,
                                     "after_epoch": int(event["epoch"]), "switch_lag_s": round(lag, 3),
                                     "shares": dict(zip(emu.names, [round(x, 4) for x in phase_shares[phase]]))})
                log(f"{run.name}: phase {phase} ({schedule.phases[phase].name}) after epoch {event['epoch']}: shares "
                    + " ".join(f"{k}={v:.4g}" for k, v in zip(emu.names, phase_shares[phase])))
            return False

        t = time.monotonic()
        run = run_cluster(s, emu, f"{s.mode}-schedule-{name}", name, on_event=on_event)
        record = summarize(s, emu, run, name, None, None)
        basis = "epoch" if s.adjust_every == "epoch" else "adjust"
        first = analysis.to_steady(run.events, emu.names, basis=basis, tolerance=BALANCE_TOLERANCE,
                                   until_epoch=every)
        changes = []
        bounds = [sw["after_epoch"] for sw in run.switches] + [s.epochs]
        for sw, until in zip(run.switches, bounds[1:]):
            st = analysis.to_steady(run.events, emu.names, basis=basis, tolerance=BALANCE_TOLERANCE,
                                    after_epoch=sw["after_epoch"], until_epoch=until)
            changes.append({**sw, "from_profile": schedule.phases[sw["phase"] - 1].name,
                            "adjustments_to_steady": st["adjustments"], "plan_changes_to_steady": st["plan_changes"],
                            "steady_epoch": st["steady_epoch"], "stayed_steady": st["stayed_steady"]})
        record["initial_phase"] = {"profile": schedule.phases[0].name, **first}
        record["phase_changes"] = changes
        runs[name] = record
        report["timings_s"][f"run_{name}"] = round(time.monotonic() - t, 1)
        if name == "dynamic":
            worst = [c["adjustments_to_steady"] for c in changes]
    report["runs"] = runs
    value = None if not worst or None in worst else max(worst)  # type: ignore[type-var]
    report["targets"] = [
        analysis.target("dynamic schedule: max adjustments_to_steady over phase changes", value, "<=", 2, SOURCE),
    ]


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
        started = analysis.of_kind(run.events, "first_round")[:1]
        record["time_to_accuracy_from_first_round_s"] = (
            None if reached is None or not started else round(reached["wall_s"] - started[0]["wall_s"], 3))
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


# ------------------------------------------------------------------------------------ reporting
def environment(s: Settings, emu: Emulation) -> dict[str, Any]:
    from importlib.metadata import version

    return {
        "limiter": emu.limiting,
        "cpu_budget": round(s.cpu_budget, 4),
        "shares": {n: round(x, 4) for n, x in zip(emu.names, emu.shares)},
        "server_share": None if emu.server_share is None else round(emu.server_share, 4),
        "period_us": emu.period_us,
        "slowdowns": {n: round(f, 4) for n, f in zip(emu.names, emu.slowdowns)} if emu.backend is None else None,
        "torch": version("torch"),  # not imported here: this process only drives the others
        "python": platform.python_version(),
        "cpus": len(os.sched_getaffinity(0)),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "threads_per_worker": 1,
    }


def render_table(report: dict) -> str:
    """The short markdown summary printed after the JSON."""
    runs = report.get("runs", {})
    parts = []
    if report.get("ideal") or report.get("ddp_uniform"):
        ideal = report.get("ideal") or {}
        base = [["ideal (solo sum)", ideal.get("samples_per_s")],
                ["ideal, solos all at once (sum)", (ideal.get("together") or {}).get("samples_per_s")],
                ["ddp_uniform", (report.get("ddp_uniform") or {}).get("samples_per_s")]]
        parts.append(analysis.markdown_table(["baseline", "samples/s"], base))
    if report["kind"] == "tta":
        rows = [[n, r.get("time_to_accuracy_s"), r.get("epochs_to_accuracy"), r.get("best_accuracy"), r.get("samples_per_s")]
                for n, r in runs.items()]
        parts.append(analysis.markdown_table(["controller", "time to target (s)", "epochs", "best acc", "samples/s"], rows))
    elif report["kind"] == "schedule":
        for n, r in runs.items():
            rows = [[f"{c['from_profile']}->{c['profile']}", c["after_epoch"], c["adjustments_to_steady"],
                     c["plan_changes_to_steady"], c["steady_epoch"]] for c in r.get("phase_changes", [])]
            parts.append(f"{n}: {r.get('samples_per_s_overall')} samples/s overall, accuracy {r.get('accuracy')}\n\n"
                         + analysis.markdown_table(["phase change", "after epoch", "adjustments", "plan changes",
                                                    "steady epoch"], rows))
    else:
        header = ["controller", "samples/s", "overall", "vs ideal", "vs ideal (all at once)", "vs DDP", "spread",
                  "adj to steady", "accuracy"]
        if report["mode"] == "asp":
            header.append("update skew")
        header.append("batches")
        rows = []
        for n, r in runs.items():
            row = [n, r.get("samples_per_s"), r.get("samples_per_s_overall"), r.get("ratio_to_ideal"),
                   r.get("ratio_to_ideal_together"), r.get("ratio_to_ddp_uniform"), r.get("compute_spread"), r.get("adjustments_to_steady"), r.get("accuracy")]
            if report["mode"] == "asp":
                row.append(r.get("update_skew"))
            row.append(r.get("batch_sizes"))
            rows.append(row)
        parts.append(analysis.markdown_table(header, rows))
        if report.get("compose_vs_emulator"):
            parts.append("in containers vs on the cgroup emulator, steady samples/s: " + ", ".join(
                f"{name} {ratio}" for name, ratio in report["compose_vs_emulator"].items()))
    targets = report.get("targets", [])
    if targets:
        rows = [[t["name"], t["value"], f"{t['op']} {t['threshold']}",
                 "PASS" if t["pass"] else "FAIL" if t["pass"] is False else "n/a"] for t in targets]
        parts.append(analysis.markdown_table(["target", "value", "needs", "result"], rows))
    env = report["environment"]
    parts.append(f"limiter {env['limiter']}, cpu budget {env['cpu_budget']}, period {env['period_us']} us, "
                 f"load average at start {env['loadavg_start']}, torch {env['torch']}")
    return "\n\n".join(parts)


# ----------------------------------------------------------------------------------------- CLI
def _fraction(text: str) -> float:
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1], got {text!r}")
    return value


def _adjust_every(text: str) -> str:
    if text == "epoch" or (text.isdigit() and int(text) > 0):
        return text
    raise argparse.ArgumentTypeError(f"expected 'epoch' or a positive integer, got {text!r}")


CONTROLLERS = {"bsp": ["uniform", "static", "dynamic"], "asp": ["uniform", "dynamic", "dynamic_no_lr_scaling"]}
# runs that are a controller plus server flags; dynamic_allreduce (the BSP collective fast path) is opt-in:
# --controllers uniform,static,dynamic,dynamic_allreduce
# (its default all-reduce on CPU workers is the hub; dynamic_allreduce_ring is torch's all_reduce)
RUN_VARIANTS = {
    "dynamic_no_lr_scaling": ("dynamic", ["--no-lr-scaling"]),
    "dynamic_allreduce": ("dynamic", ["--allreduce"]),
    "dynamic_allreduce_ring": ("dynamic", ["--allreduce", "--allreduce-algorithm", "ring"]),
    "dynamic_busy": ("dynamic", ["--balance", "busy"]),
    "dynamic_compute": ("dynamic", ["--balance", "compute"]),
    "dynamic_cycle": ("dynamic", ["--balance", "cycle"]),
    # the same job in deploy/docker-compose.yml's containers (docker cpu_quota, host networking)
    "uniform_compose": ("uniform", []),
    "dynamic_compose": ("dynamic", []),
}
OPT_IN = {"bsp": ["dynamic_allreduce", "dynamic_allreduce_ring", "dynamic_busy", "dynamic_compute", "dynamic_cycle",
                  "uniform_compose", "dynamic_compose"],
          "asp": ["dynamic_busy", "dynamic_compute", "uniform_compose", "dynamic_compose"]}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.hetero",
        description=(
            "Emulate a heterogeneous cluster with per-worker CPU quotas and measure, in one run and under the same "
            "quotas: each worker alone (the ideal), equal-batch PyTorch DDP, and our parameter server with the "
            "uniform/static/dynamic batch controllers. Progress on stderr; JSON (--json) then a markdown table on stdout."
        ),
        epilog=(
            "examples:\n"
            "  python -m benchmarks.hetero --profile hl8 --mode bsp --json\n"
            "  python -m benchmarks.hetero --profile hl8 --mode asp --json\n"
            "  python -m benchmarks.hetero --schedule dynamic --every-epochs 3 --json\n"
            "  python -m benchmarks.hetero --profile hl8 --tta 0.95 --json\n"
            "  python -m benchmarks.hetero --tiny --json            # smoke test (under a minute)\n"
            "  python -m benchmarks.hetero --profile hl8 --controllers dynamic,dynamic_compose --no-baselines --json\n"
            "                                                       # the cgroup emulator beside docker compose\n"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = p.add_argument_group("what to measure")
    what.add_argument("--profile", default="hl8", metavar="NAME|PATH", help="heterogeneity profile (default: hl8)")
    what.add_argument("--mode", choices=["bsp", "asp"], default="bsp", help="training mode (default: bsp)")
    what.add_argument("--schedule", metavar="NAME|PATH",
                      help="dynamic heterogeneity: step the quotas through this schedule's phases (e.g. dynamic); "
                      "replaces --profile")
    what.add_argument("--every-epochs", type=positive_int, metavar="N",
                      help="phase length in epochs for --schedule (default: the schedule's)")
    what.add_argument("--tta", type=_fraction, metavar="TARGET",
                      help="time uniform and dynamic to this test accuracy (default workload: digits, cnn width=96, B=512)")
    what.add_argument("--controllers", metavar="LIST", help="comma-separated runs to make (default: bsp uniform,static,dynamic; asp "
                      "uniform,dynamic,dynamic_no_lr_scaling; --schedule dynamic; --tta uniform,dynamic; bsp also "
                      "takes dynamic_allreduce, the collective fast path, and dynamic_allreduce_ring, the same with torch's "
                      "ring all_reduce instead of the hub, and dynamic_cycle, dynamic with --balance cycle; both take dynamic_busy and "
                      "dynamic_compute, dynamic with --balance busy or compute instead of the server's default, auto: busy "
                      "for BSP on the PS path, compute otherwise; both take uniform_compose and dynamic_compose, the same "
                      "job in deploy/docker-compose.yml's containers at the same quotas, which needs a Docker engine: "
                      "deploy/engine.sh)")
    what.add_argument("--no-baselines", action="store_true",
                      help="skip the ideal and DDP measurements (the default for --mode asp, --schedule and --tta)")
    what.add_argument("--baselines", action="store_true", help="measure the ideal and DDP in every mode")
    job = p.add_argument_group("workload (default: cnn on synthetic 32x32 images, size=4096, global batch 512)")
    job.add_argument("--model", help="model for every run (default: cnn)")
    job.add_argument("--model-arg", action="append", metavar="K=V", help="model option (--tta default: width=96)")
    job.add_argument("--dataset", help="data set (default: synthetic; --tta: digits)")
    job.add_argument("--dataset-arg", action="append", metavar="K=V", help="data set option (default: size=4096)")
    job.add_argument("--global-batch", type=positive_int, help="global batch B (default: 512)")
    job.add_argument("--epochs", type=positive_int,
                     help="epochs per run (default: 12; --schedule: phases x every; --tta: 60, a run stops at the target)")
    job.add_argument("--lr", type=positive_float, help="learning rate (default: bsp 0.02, asp 0.1)")
    job.add_argument("--momentum", type=float, default=0.9, help="SGD momentum, BSP and baselines (default: 0.9)")
    job.add_argument("--seed", type=int, default=0, help="model initialisation and data split (default: 0)")
    job.add_argument("--adjust-every", type=_adjust_every, default="epoch", metavar="{epoch,N}",
                     help="controller granularity passed to ps-server (default: epoch)")
    job.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                     help="extra ps-server argument, repeatable (e.g. --server-arg=--deadband=0.05)")
    emu = p.add_argument_group("emulation")
    emu.add_argument("--cpu-budget", type=positive_float, metavar="CORES",
                     help="cores shared by the workers, in the profile's ratios (default: usable CPUs - 0.5)")
    emu.add_argument("--server-share", type=positive_float, metavar="CORES",
                     help="the server's reserved CPU quota (default: bsp unlimited; asp the profile's server cores, "
                     "scaled like the workers')")
    emu.add_argument("--period-us", type=int, metavar="US", help="CFS period (default: 1 ms / smallest share, e.g. 8000 for 1/8 core)")
    emu.add_argument("--limiter", choices=["auto", "cgroup", "slowdown"],
                     help="cgroup quotas, or software slowdown (default: auto; --tiny: slowdown)")
    meas = p.add_argument_group("measurement")
    meas.add_argument("--solo-seconds", type=float, default=6.0, help="timed seconds per solo run (default: 6)")
    meas.add_argument("--ddp-seconds", type=float, default=10.0, help="about this many timed seconds of DDP (default: 10)")
    meas.add_argument("--steady-fraction", type=_fraction, default=0.5,
                      help="last fraction of the epochs that counts as steady state (default: 0.5)")
    meas.add_argument("--run-timeout", type=positive_float, default=1800.0, help="seconds per run before giving up")
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the JSON report on stdout before the table")
    out.add_argument("--out", type=Path, metavar="DIR",
                     help="keep logs and metrics here and write <name>.json / <name>.md (default: a temporary folder)")
    out.add_argument("--tiny", action="store_true",
                     help="smoke test: tiny data and model, 2 epochs, a few steps per measurement, software slowdown")
    return p


def settings(args: argparse.Namespace, workdir: Path) -> Settings:
    if args.tta is not None and args.schedule:
        raise SystemExit("hetero: error: choose one of --tta and --schedule")
    if args.baselines and args.no_baselines:
        raise SystemExit("hetero: error: choose one of --baselines and --no-baselines")
    profile = load_profile(args.profile)
    schedule = load_schedule(args.schedule) if args.schedule else None
    if schedule is not None and args.every_epochs:
        schedule = schedule.every(epochs=args.every_epochs)
    if schedule is not None and schedule.every_epochs is None:
        raise SystemExit(f"hetero: error: schedule {schedule.name!r} counts seconds; pass --every-epochs N")
    if schedule is not None:
        profile = schedule.phases[0]
    profile.allocation(args.mode)  # ValueError if the profile lacks the mode
    tta = args.tta is not None
    if args.tiny:
        workload = Workload(model="cnn", model_args=("width=8",), dataset="synthetic",
                            dataset_args=("size=320", "image_size=16"), global_batch=64)
        if tta:
            workload = Workload(model="mlp", model_args=("hidden=32",), dataset="digits", dataset_args=(), global_batch=64)
    elif tta:
        # compute-bound on digits (a balanced step ~100 ms at HL8, as the throughput runs): the runs
        # then measure balancing, not the RPC's fixed cost per step
        workload = Workload(model="cnn", model_args=("width=96",), dataset="digits", dataset_args=(), global_batch=512)
    else:
        workload = Workload()
    lr = args.lr if args.lr is not None else (0.1 if args.mode == "asp" else Workload.lr if not tta else 0.1)
    workload = replace(
        workload,
        model=args.model or workload.model,
        model_args=tuple(args.model_arg) if args.model_arg else workload.model_args,
        dataset=args.dataset or workload.dataset,
        dataset_args=tuple(args.dataset_arg) if args.dataset_arg else workload.dataset_args,
        global_batch=args.global_batch or workload.global_batch,
        lr=lr, momentum=args.momentum, seed=args.seed,
    )
    if schedule is not None:
        epochs = args.epochs or int(schedule.interval) * len(schedule.phases)
        default_runs = ["dynamic"]
    elif tta:
        epochs = args.epochs or (3 if args.tiny else 60)
        default_runs = ["uniform", "dynamic"]
    else:
        epochs = args.epochs or (2 if args.tiny else 12)
        default_runs = CONTROLLERS[args.mode]
    controllers = [c.strip() for c in args.controllers.split(",") if c.strip()] if args.controllers else default_runs
    allowed = set(CONTROLLERS[args.mode]) | set(OPT_IN[args.mode]) if schedule is None and not tta else {"uniform", "static", "dynamic"}
    unknown = [c for c in controllers if c not in allowed]
    if unknown or not controllers:
        raise SystemExit(f"hetero: error: --controllers: unknown {unknown or 'empty'}; choose from {sorted(allowed)}")
    baselines = (args.mode == "bsp" and schedule is None and not tta) if not (args.baselines or args.no_baselines) \
        else args.baselines
    return Settings(
        mode=args.mode, profile=profile, schedule=schedule, tta=args.tta, workload=workload, epochs=epochs,
        controllers=controllers, adjust_every=args.adjust_every,
        cpu_budget=args.cpu_budget or default_cpu_budget(), server_share=args.server_share, period_us=args.period_us,
        limiter=args.limiter or ("slowdown" if args.tiny and schedule is None else "auto"),
        baselines=baselines,
        solo_seconds=0.0 if args.tiny else args.solo_seconds, solo_warmup=1 if args.tiny else 2,
        solo_min_steps=2 if args.tiny else 3,
        ddp_seconds=0.0 if args.tiny else args.ddp_seconds, ddp_warmup=1 if args.tiny else 3,
        ddp_min_steps=2 if args.tiny else 5,
        steady_fraction=args.steady_fraction,
        server_args=["--quiet", *args.server_arg], run_timeout=args.run_timeout, workdir=workdir, tiny=args.tiny,
    )


def report_name(s: Settings) -> str:
    if s.schedule is not None:
        return f"hetero-{s.mode}-schedule-{s.schedule.name}"
    if s.tta is not None:
        return f"hetero-{s.mode}-{s.profile.name}-tta"
    return f"hetero-{s.mode}-{s.profile.name}"


def run(s: Settings) -> dict[str, Any]:
    """Measure everything the settings ask for; the report as a dict."""
    emu = resolve_emulation(s)
    kind = "schedule" if s.schedule is not None else "tta" if s.tta is not None else "throughput"
    report: dict[str, Any] = {
        "benchmark": "hetero",
        "kind": kind,
        "mode": s.mode,
        "profile": s.profile.name,
        "schedule": None if s.schedule is None else {
            "name": s.schedule.name, "every_epochs": int(s.schedule.interval),
            "phases": [p.name for p in s.schedule.phases]},
        "tiny": s.tiny,
        "environment": environment(s, emu),
        "workload": {**s.workload.describe(), "epochs": s.epochs, "adjust_every": s.adjust_every,
                     "steady_fraction": s.steady_fraction, "balance_tolerance": BALANCE_TOLERANCE,
                     "server_args": s.server_args},
        "ideal": None,
        "ddp_uniform": None,
        "runs": {},
        "targets": [],
        "timings_s": {},
    }
    env = report["environment"]
    log(f"{report_name(s)}: limiter {env['limiter']}, cpu budget {env['cpu_budget']}, shares {env['shares']}"
        + (f", server {env['server_share']}" if env["server_share"] else "") + f", period {env['period_us']} us, "
        f"load average {env['loadavg_start']}")
    started = time.monotonic()
    if kind == "schedule":
        bench_schedule(s, emu, report)
    elif kind == "tta":
        bench_tta(s, emu, report)
    else:
        bench_throughput(s, emu, report)
    report["timings_s"]["total"] = round(time.monotonic() - started, 1)
    env["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    return report


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from deploy.launcher import Terminated, signals_as_exceptions

    keep = args.out is not None
    workdir = args.out if keep else Path(tempfile.mkdtemp(prefix="hetero-bench-"))
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        with signals_as_exceptions():
            try:
                s = settings(args, workdir)
            except ValueError as exc:
                print(f"hetero: error: {exc}", file=sys.stderr)
                return 2
            report = run(s)
    except KeyboardInterrupt:
        print("hetero: interrupted; every process and cgroup was removed", file=sys.stderr)
        return 130
    except Terminated as exc:
        print(f"hetero: {exc}; every process and cgroup was removed", file=sys.stderr)
        return 143
    except (RuntimeError, TimeoutError) as exc:
        print(f"hetero: error: {exc}", file=sys.stderr)
        if not keep:
            print("hetero: (pass --out DIR to keep the logs)", file=sys.stderr)
        return 1
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    table = render_table(report)
    text = json.dumps(report, indent=2)
    if keep:
        save_report(workdir, report_name(s), text, table)
    print_report(text, table, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Our server's runs on the emulated cluster: the runs each mode has (a controller, plus server flags
for a variant), and ps-server with its workers under their quotas (:class:`deploy.launcher.LocalCluster`)
to the job's end, with their metrics events."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.hetero.settings import Emulation, Settings, log
from benchmarks.workload import Workload

PROFILES = Path(__file__).resolve().parent / "profiles"
"""The cases' profiles."""


CONTROLLERS = {"bsp": ["uniform", "static", "dynamic"], "asp": ["uniform", "dynamic", "dynamic_no_lr_scaling"]}
POLICIES = ("uniform", "static", "dynamic", "model", "auto")
"""The batch policies (ps-server --controller): what --schedule and --tta runs take."""


@dataclass(frozen=True)
class Case:
    """A batch-policy case (--case): its profile (benchmarks/hetero/profiles/), workload, epochs and
    decision granularity."""

    profile: Path
    workload: Workload
    epochs: int
    adjust_every: str


CASES = {
    # the README's quick start
    "quickstart": Case(PROFILES / "quickstart.yaml",
                       Workload(model="mlp", model_args=("hidden=512",), dataset="digits", dataset_args=(),
                                global_batch=256, lr=0.1), epochs=20, adjust_every="5"),
    # HL8 with the default CNN workload and a fixed per-step cost on every worker
    "hl8-fixed": Case(PROFILES / "hl8-fixed.yaml", Workload(), epochs=12, adjust_every="epoch"),
}


# runs that are a controller plus server flags; dynamic_allreduce (the BSP collective fast path) is opt-in:
# --controllers uniform,static,dynamic,dynamic_allreduce
# (its default all-reduce on CPU workers is the hub; dynamic_allreduce_ring is torch's all_reduce)
RUN_VARIANTS = {
    "dynamic_no_lr_scaling": ("dynamic", ["--no-lr-scaling"]),
    "dynamic_allreduce": ("dynamic", ["--allreduce"]),
    "dynamic_allreduce_ring": ("dynamic", ["--allreduce", "--allreduce-algorithm", "ring"]),
    "dynamic_allreduce_compute": ("dynamic", ["--allreduce", "--balance", "compute"]),
    # --allreduce auto on CPU workers with --sampling independent: tries both paths and keeps the faster
    "dynamic_auto_trial": ("dynamic", ["--sampling", "independent"]),
    "dynamic_busy": ("dynamic", ["--balance", "busy"]),
    "dynamic_compute": ("dynamic", ["--balance", "compute"]),
    "dynamic_cycle": ("dynamic", ["--balance", "cycle"]),
    # the serial PS path: the whole gradient after backward, parameters before the next forward
    "dynamic_no_overlap": ("dynamic", ["--no-overlap"]),
    # the same job in deploy/docker-compose.yml's containers (docker cpu_quota, host networking)
    "uniform_compose": ("uniform", []),
    "dynamic_compose": ("dynamic", []),
}


OPT_IN = {"bsp": ["model", "auto", "dynamic_allreduce", "dynamic_allreduce_ring", "dynamic_allreduce_compute", "dynamic_auto_trial", "dynamic_busy", "dynamic_compute", "dynamic_cycle",
                  "dynamic_no_overlap",
                  "uniform_compose", "dynamic_compose"],
          "asp": ["model", "auto", "dynamic_busy", "dynamic_compute", "uniform_compose", "dynamic_compose"]}


POLL_S = 0.1


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
    on_tick: Callable[[Any, Run], bool] | None = None,
) -> Run:
    """Run ps-server and its workers to the end (or until ``on_event`` returns True for an event, or
    ``on_tick``, called every POLL_S with the cluster, for the moment); all cleaned up."""
    from deploy.launcher import LocalCluster, WorkerSpec

    # static declares each worker's cores (Eq. 4a); the launcher also passes them, this makes it explicit
    workers = [
        WorkerSpec(n, share, extra_args=(*(("--cores", repr(float(share))) if controller == "static" else ()),
                                         *emu.worker_args[i]))
        for i, (n, share) in enumerate(zip(emu.names, emu.shares, strict=True))
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
            if on_tick is not None and not finished and on_tick(cluster, run):
                stop_now = True
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

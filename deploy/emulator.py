"""``ps-cluster run``: a heterogeneous cluster on this machine, one command from profile to plots.

The emulator scales a profile's CPU allocation (OmniLearn Table I) to a CPU budget, starts a
parameter server and one worker process per worker of the profile through
:class:`deploy.launcher.LocalCluster` (each worker in a cgroup with its share as a CPU quota, or with
``--slowdown`` factors where cgroups are not writable), follows the server's metrics log to print
progress, rewrites the quotas at the phase boundaries of a schedule (OmniLearn Fig. 10), and ends
with a summary table, ``summary.json`` and the plots of :mod:`deploy.plots`. The run is resolved from
its options in :mod:`deploy.run_plan`, the phases are :mod:`deploy.schedule_phases`, the summary
:mod:`deploy.run_report`; this module follows the running job.

Everything a run writes goes to its output folder: ``metrics.jsonl`` (the server's log),
``phases.jsonl`` (schedule phases, written by the emulator), ``server.log``, ``w<k>.log``,
``summary.json`` and the PNGs.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from common.job.endings import exit_status
from deploy.cli_arguments import PROG
from deploy.launcher import LocalCluster, WorkerFailedError, WorkerSpec
from deploy.run_files import MetricsTail, last_line
from deploy.run_plan import (
    DEFAULT_DATASET_ARGS,
    DEFAULT_JOB,
    DEFAULT_POLICY,
    QUICK_DATASET_ARGS,
    QUICK_JOB,
    Plan,
    RunConfig,
    resolve,
    unreached,
)
from deploy.run_report import write_report
from deploy.schedule_phases import POLL_S, SchedulePhases
from deploy.signals import ReceivedSignals, signals_as_exceptions
from ps.ops.progress import EpochBar, adapt_line, on_terminal, progress_line, trained_alongside

__all__ = [
    "DEFAULT_DATASET_ARGS", "DEFAULT_JOB", "DEFAULT_POLICY", "QUICK_DATASET_ARGS", "QUICK_JOB", "Emulation", "RunConfig",
    "RunFailed", "resolve", "run",
]


class RunFailed(RuntimeError):
    """The run started but did not finish (a worker or the server failed)."""


class Emulation:
    """One run: start the cluster, follow its log, switch phases, summarise. ``run()`` returns the summary."""

    def __init__(self, plan: Plan, out: TextIO = sys.stdout) -> None:
        self.plan = plan
        self.stdout = out
        self.events: list[dict[str, Any]] = []
        self.phases = SchedulePhases(plan, self.say)
        self.job_start: float | None = None
        self.cluster: LocalCluster | None = None
        self.bar: EpochBar | None = None  # on a terminal, from the job's start to its end

    def say(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, file=self.stdout, flush=True)

    # ------------------------------------------------------------------ run
    def run(self) -> dict[str, Any]:
        plan = self.plan
        allocation = plan.profiles[0].allocation(plan.config.mode)  # a fixed cost is set at the start
        workers = [WorkerSpec(n, s, extra_args=allocation.worker_args(i))
                   for i, (n, s) in enumerate(zip(plan.names, plan.shares[0], strict=True))]
        cluster = LocalCluster(
            plan.server_args, workers, plan.out, period_us=plan.period_us, limiter=plan.config.limiter,
            server_share=plan.server_shares[0], run_id="emulator",
        )
        self.cluster = cluster
        limiting = cluster.limiting
        if plan.schedule is not None and limiting == "slowdown":
            why = "forced by --limiter slowdown" if plan.config.limiter == "slowdown" else "cgroups are not writable here"
            raise ValueError(
                f"--schedule needs live CPU quotas, but the workers would run with fixed --slowdown factors "
                f"({why}); the slowdown fallback cannot change a worker's speed while it runs"
            )
        plan.out.mkdir(parents=True, exist_ok=True)
        self.phases.clear()
        self._describe(cluster)
        started = time.monotonic()
        try:
            with signals_as_exceptions() as received, cluster:
                cluster.start()
                received.check()
                self.say(f"server on {cluster.target}; logs, metrics and plots in {plan.out}/")
                code = self._follow(cluster, received)
                cluster.wait()  # the server has exited: give the workers a moment to exit on their own
                cluster.close()
                received.check()
        finally:
            if self.bar is not None:
                self.bar.close()
                self.bar = None
        total_s = time.monotonic() - started
        summary = next((e for e in reversed(self.events) if e.get("event") == "summary"), None)
        if summary is None or code != exit_status(summary["reason"]):  # an early end's 3 comes with its summary
            last = last_line(plan.out / "server.log")
            raise RunFailed(
                f"the server exited with status {code}{' without a summary' if summary is None else ''}"
                + (f": {last}" if last else f" (see {plan.out / 'server.log'})")
            )
        return write_report(plan, self.events, self.phases.records, self.phases.index, summary, total_s,
                            cluster.limiting, self.say)

    def _describe(self, cluster: LocalCluster) -> None:
        plan = self.plan
        job = " ".join(plan.server_args)
        head = f"{plan.config.mode.upper()} {plan.config.policy} policy, {len(plan.names)} workers"
        if plan.schedule is not None:
            s = plan.schedule
            head += f", schedule {s.name}: {plan.phase_label}, every {s.interval:g} {s.unit}"
        else:
            head += f", profile {plan.profiles[0].name} (HL {plan.profiles[0].allocation(plan.config.mode).heterogeneity:g})"
        self.say(head)
        self.say(cluster.plan() + "; 1 torch thread per worker")
        self.say(f"ps-server {job}")

    def _follow(self, cluster: LocalCluster, received: ReceivedSignals) -> int:
        tail = MetricsTail(cluster.metrics_path)
        while True:
            received.check()  # a Ctrl-C or SIGTERM whose exception a finalizer swallowed
            for event in tail.read():
                self._on_event(event)
            try:
                cluster.check_workers()
            except WorkerFailedError as exc:
                raise RunFailed(str(exc)) from exc
            except RuntimeError as exc:
                raise RunFailed(str(exc)) from exc
            self.phases.on_clock(cluster, self.job_start, self.events)
            code = cluster.poll()
            if code is not None:
                for event in tail.read():
                    self._on_event(event)
                return code
            time.sleep(POLL_S)

    # --------------------------------------------------------------- events
    def _on_event(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        kind = event.get("event")
        if kind == "adjust":
            if self.job_start is None:
                self.job_start = float(event["time"])
                self.say(f"job started: every worker joined; first plan {self._batches(event)}")
                if on_terminal(self.stdout):
                    self.bar = EpochBar(self.plan.epochs, self.stdout)
                self.phases.log(0, event)
            elif event.get("changed"):
                self.say(f"  plan at step {event['step']}: {self._batches(event)} (adjustment {event['adjustments']})")
        elif kind == "adapt" and event.get("changed"):
            self.say(f"  {adapt_line(event)} at step {event['step']}")
        elif kind == "epoch":
            if self.bar is None or not self.bar.update(event):
                self._print_epoch(event)
            assert self.cluster is not None
            self.phases.after_epoch(self.cluster, event)
        elif kind == "summary" and self.bar is not None:
            self.bar.close()
            self.bar = None
        elif kind in ("evict", "leave", "end") and not event.get("done") and (line := progress_line(event)) is not None:
            # a worker gone from the running job (ps-cluster run starts no other), a job that ended early
            self.say(f"  {line}")
        elif kind == "eval" and (self.bar is None or not self.bar.update(event)):
            self.say(f"  test accuracy after epoch {event['epoch']}: {100 * event['accuracy']:.1f}% (loss {event['loss']:.4f})")

    def _batches(self, event: dict[str, Any]) -> str:
        sizes = event.get("batch_sizes") or {}
        return " ".join(f"{n}={sizes[n]}" for n in self.plan.names if n in sizes)

    def _print_epoch(self, event: dict[str, Any]) -> None:
        if (along := trained_alongside(event)) is not None:
            self.say(f"epoch {event['epoch']:>2}/{self.plan.epochs} | {along} (the figures above are both epochs')")
            return
        sizes, times = event.get("batch_sizes") or {}, event.get("compute_ms") or {}
        cells = [
            f"{n} b={sizes.get(n, '-'):>4} {times[n]:6.0f} ms" if n in times else f"{n} b={sizes.get(n, '-'):>4}      - ms"
            for n in self.plan.names
        ]
        rate = event.get("samples_per_s")
        rate_text = f"{rate:7.0f} samples/s" if rate is not None else ""
        self.say(f"epoch {event['epoch']:>2}/{self.plan.epochs} | " + " | ".join(cells) + f" | {rate_text}")


def run(config: RunConfig, out: TextIO = sys.stdout) -> dict[str, Any]:
    """Resolve and run; ValueError for bad input, RunFailed when the run breaks, Terminated on SIGTERM.
    A schedule's phases that --epochs ends the job before are named on stderr first."""
    plan = resolve(config)
    if plan.schedule is not None and (left := unreached(plan.schedule, plan.epochs)):
        print(f"{PROG}: warning: {left}", file=sys.stderr, flush=True)
    return Emulation(plan, out).run()

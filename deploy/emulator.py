"""``ps-cluster run``: a heterogeneous cluster on this machine, one command from profile to plots.

The emulator scales a profile's CPU allocation (OmniLearn Table I) to a CPU budget, starts a
parameter server and one worker process per worker of the profile through
:class:`deploy.launcher.LocalCluster` (each worker in a cgroup with its share as a CPU quota, or with
``--slowdown`` factors where cgroups are not writable), follows the server's metrics log to print
progress, rewrites the quotas at the phase boundaries of a schedule (OmniLearn Fig. 10), and ends
with a summary table, ``summary.json`` and the plots of :mod:`deploy.plots`.

Everything a run writes goes to its output folder: ``metrics.jsonl`` (the server's log),
``phases.jsonl`` (schedule phases, written by the emulator), ``server.log``, ``w<k>.log``,
``summary.json`` and the PNGs.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from deploy.launcher import LocalCluster, WorkerFailedError, WorkerSpec
from deploy.profiles import (
    Profile,
    Schedule,
    check_mode,
    default_cpu_budget,
    load_profile,
    load_schedule,
    quota_period_us,
    scale,
)
from deploy.server_args import server_parser, split_server_args
from deploy.signals import ReceivedSignals, signals_as_exceptions
from ps.ops.progress import EpochBar, on_terminal

DEFAULT_JOB: dict[str, Any] = {
    "model": "cnn",
    "dataset": "synthetic",
    "global_batch": 512,
    "epochs": 8,
    "lr": 0.02,  # the benchmarks' workload lr: 0.05 spiked after converging in ~1 run in 3
}
"""The main job: a small CNN on generated 32x32 images; about 1-3 minutes on a 2-core machine."""
DEFAULT_DATASET_ARGS: dict[str, list[str]] = {"synthetic": ["size=4096"]}
"""Dataset options used when the dataset is the default one and no --dataset-arg is given."""
QUICK_JOB: dict[str, Any] = {"global_batch": 256, "epochs": 4}
"""--quick: fewer epochs and a smaller dataset, for smoke tests and first impressions."""
QUICK_DATASET_ARGS: dict[str, list[str]] = {"synthetic": ["size=1536", "image_size=16"]}
DEFAULT_POLICY = {"profile": "model", "schedule": "dynamic"}
"""The batch policy without --policy: model fits fixed speeds best (docs/benchmarks.md), but its
fits trail speeds that change under them, where dynamic's measured times do not (docs/policies.md)."""
QUICK_EVERY_EPOCHS = 2
"""--quick with an epoch-based schedule: phases this many epochs long (the batch policy needs one to react)."""
RESERVED_SERVER_FLAGS = ("--port", "--port-file", "--metrics-log", "--workers", "--host")
"""ps-server flags the emulator sets itself."""
OWN_FLAGS = (
    "--mode", "--epochs", "--model", "--dataset", "--global-batch", "--lr", "--policy", "--controller", "--adjust-every",
    "--model-arg", "--dataset-arg",
)
"""ps-server flags that ps-cluster run has as options of its own."""
POLL_S = 0.1


class RunFailed(RuntimeError):
    """The run started but did not finish (a worker or the server failed)."""


@dataclass
class RunConfig:
    """Everything ``ps-cluster run`` needs; ``None`` means "the default" (see :func:`resolve`)."""

    profile: str = "hl8"
    schedule: str | None = None
    every_epochs: int | None = None
    every_seconds: float | None = None
    mode: str = "bsp"
    cpu_budget: float | None = None
    policy: str | None = None  # model on a fixed profile, dynamic on a schedule (DEFAULT_POLICY)
    epochs: int | None = None
    model: str | None = None
    model_args: list[str] | None = None
    dataset: str | None = None
    dataset_args: list[str] | None = None
    global_batch: int | None = None
    lr: float | None = None
    adjust_every: str | None = None
    limiter: str = "auto"
    out: Path | None = None
    quick: bool = False
    server_args: list[str] = field(default_factory=list)


@dataclass
class Plan:
    """A resolved run: the phases' shares, the server's command line, where output goes."""

    config: RunConfig
    profiles: list[Profile]
    shares: list[list[float]]
    server_shares: list[float | None]
    schedule: Schedule | None
    period_us: int
    server_args: list[str]
    out: Path
    names: list[str]
    epochs: int

    @property
    def phase_label(self) -> str:
        return " -> ".join(p.name for p in self.profiles)


def _server_share(profile: Profile, mode: str, budget: float) -> float | None:
    """The server's quota in ASP: the profile's server cores at the same scale as the workers'."""
    allocation = profile.allocation(mode)
    if mode != "asp" or allocation.server is None:
        return None
    return allocation.server * budget / sum(allocation.workers)


def _refused(flag: str) -> str | None:
    """Why ``ps-cluster run --server-arg`` refuses ``flag``, or None."""
    if flag in RESERVED_SERVER_FLAGS:
        return " is set by the emulator (workers come from the profile)"
    if flag in OWN_FLAGS:
        return f": use ps-cluster run {flag} instead"
    return None


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a folder")


def resolve(config: RunConfig) -> Plan:
    """Load the profile or schedule, scale it to the budget, and build the server's arguments.

    ValueError (bad input) names what is wrong; nothing has started yet.
    """
    mode = check_mode(config.mode)
    budget = default_cpu_budget() if config.cpu_budget is None else float(config.cpu_budget)
    if not budget > 0:
        raise ValueError(f"--cpu-budget must be > 0, got {budget}")
    schedule = None
    epochs = config.epochs
    if config.schedule is not None:
        schedule = load_schedule(config.schedule)
        if config.every_epochs is not None or config.every_seconds is not None:
            schedule = schedule.every(epochs=config.every_epochs, seconds=config.every_seconds)
        elif config.quick and schedule.every_epochs is not None:
            schedule = schedule.every(epochs=QUICK_EVERY_EPOCHS)
        profiles = list(schedule.phases)
        if epochs is None and schedule.every_epochs is not None:
            epochs = schedule.every_epochs * len(profiles)
    else:
        if config.every_epochs is not None or config.every_seconds is not None:
            raise ValueError("--every-epochs / --every-seconds need --schedule")
        profiles = [load_profile(config.profile)]
    shares = [scale(p, mode, budget) for p in profiles]
    counts = {len(s) for s in shares}
    if len(counts) != 1:
        raise ValueError(f"every phase must have the same number of workers, got {sorted(counts)}")
    server_shares = [_server_share(p, mode, budget) for p in profiles]
    if len({share is None for share in server_shares}) > 1:
        without = ", ".join(p.name for p, share in zip(profiles, server_shares, strict=True) if share is None)
        raise ValueError(
            f"in {mode} every phase must give the server a share of cores, or none must: {without} give none "
            "(the server's quota could not be set, or lifted, at a phase change)"
        )
    everything = [s for phase in shares for s in phase] + [s for s in server_shares if s is not None]
    period = quota_period_us(everything)

    if config.policy is None:
        config = replace(config, policy=DEFAULT_POLICY["schedule" if schedule is not None else "profile"])
    quick = config.quick
    job = {**DEFAULT_JOB, **(QUICK_JOB if quick else {})}
    model = config.model or job["model"]
    dataset = config.dataset or job["dataset"]
    if config.dataset_args is not None:
        dataset_args = list(config.dataset_args)
    elif config.dataset is None or config.dataset == DEFAULT_JOB["dataset"]:
        dataset_args = list((QUICK_DATASET_ARGS if quick else DEFAULT_DATASET_ARGS).get(dataset, []))
    else:
        dataset_args = []
    epochs = epochs if epochs is not None else job["epochs"]
    global_batch = config.global_batch if config.global_batch is not None else job["global_batch"]
    lr = config.lr if config.lr is not None else job["lr"]
    if epochs < 1 or global_batch < 1 or not lr > 0:
        raise ValueError("--epochs and --global-batch must be >= 1 and --lr > 0")
    names = [f"w{k}" for k in range(len(shares[0]))]
    if global_batch < len(names):
        raise ValueError(f"--global-batch {global_batch} is smaller than the {len(names)} workers")

    server_args = [
        "--mode", mode, "--workers", str(len(names)), "--model", model, "--dataset", dataset,
        "--epochs", str(epochs), "--global-batch", str(global_batch), "--lr", repr(lr),
        "--controller", str(config.policy), "--quiet",
    ]
    for arg in config.model_args or []:
        server_args += ["--model-arg", arg]
    for arg in dataset_args:
        server_args += ["--dataset-arg", arg]
    if config.adjust_every is not None:
        server_args += ["--adjust-every", str(config.adjust_every)]
    parser = server_parser()
    server_args += split_server_args(config.server_args, parser, _refused)
    parser.parse_args([*server_args, "--port", "0"])  # a value only ps-server checks fails here, not after the run started
    out = config.out if config.out is not None else _fresh(Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S"))
    _check_out(Path(out))
    return Plan(config, profiles, shares, server_shares, schedule, period, server_args, Path(out), names, epochs)


def _fresh(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3``, ... if it exists already."""
    candidate, k = path, 1
    while candidate.exists():
        k += 1
        candidate = path.with_name(f"{path.name}-{k}")
    return candidate


class MetricsTail:
    """Reads the events appended to a JSON-lines file since the last call (complete lines only)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._pending = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        events = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                events.append(record)
        return events


def _cores(share: float) -> str:
    return f"{share:.3g} core" + ("" if share == 1 else "s")


def _fmt_shares(names: Sequence[str], shares: Sequence[float]) -> str:
    return " ".join(f"{n}={s:.3g}" for n, s in zip(names, shares, strict=True))


class Emulation:
    """One run: start the cluster, follow its log, switch phases, summarise. ``run()`` returns the summary."""

    def __init__(self, plan: Plan, out: TextIO = sys.stdout) -> None:
        self.plan = plan
        self.stdout = out
        self.events: list[dict[str, Any]] = []
        self.phases: list[dict[str, Any]] = []
        self.phase = 0
        self.job_start: float | None = None
        self.cluster: LocalCluster | None = None
        self.phases_path = plan.out / "phases.jsonl"
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
        self.phases_path.unlink(missing_ok=True)
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
        if code != 0 or summary is None:
            last = _last_line(plan.out / "server.log")
            raise RunFailed(
                f"the server exited with status {code} without a summary"
                + (f": {last}" if last else f" (see {plan.out / 'server.log'})")
            )
        return self._finish(summary, total_s, cluster.limiting)

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
            self._clock_phase()
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
                self._log_phase(0, event)
            elif event.get("changed"):
                self.say(f"  plan at step {event['step']}: {self._batches(event)} (adjustment {event['adjustments']})")
        elif kind == "epoch":
            if self.bar is None or not self.bar.update(event):
                self._print_epoch(event)
            schedule = self.plan.schedule
            if schedule is not None and schedule.every_epochs is not None:
                epoch = int(event["epoch"])
                if epoch < self.plan.epochs and epoch % schedule.every_epochs == 0:
                    index = schedule.phase_index(epoch)
                    if index != self.phase:
                        self._switch(index, event)
        elif kind == "summary" and self.bar is not None:
            self.bar.close()
            self.bar = None
        elif kind == "eval" and (self.bar is None or not self.bar.update(event)):
            self.say(f"  test accuracy after epoch {event['epoch']}: {100 * event['accuracy']:.1f}% (loss {event['loss']:.4f})")

    def _batches(self, event: dict[str, Any]) -> str:
        sizes = event.get("batch_sizes") or {}
        return " ".join(f"{n}={sizes[n]}" for n in self.plan.names if n in sizes)

    def _print_epoch(self, event: dict[str, Any]) -> None:
        sizes, times = event.get("batch_sizes") or {}, event.get("compute_ms") or {}
        cells = [
            f"{n} b={sizes.get(n, '-'):>4} {times[n]:6.0f} ms" if n in times else f"{n} b={sizes.get(n, '-'):>4}      - ms"
            for n in self.plan.names
        ]
        rate = event.get("samples_per_s")
        rate_text = f"{rate:7.0f} samples/s" if rate is not None else ""
        self.say(f"epoch {event['epoch']:>2}/{self.plan.epochs} | " + " | ".join(cells) + f" | {rate_text}")

    def _clock_phase(self) -> None:
        schedule = self.plan.schedule
        if schedule is None or schedule.every_seconds is None or self.job_start is None:
            return
        if any(e.get("event") == "summary" for e in self.events[-3:]):
            return
        elapsed = time.time() - self.job_start
        index = schedule.phase_index(elapsed)
        if index != self.phase:
            self._switch(index, None, elapsed)

    def _switch(self, index: int, epoch_event: dict[str, Any] | None, elapsed: float | None = None) -> None:
        assert self.cluster is not None
        self.cluster.set_shares(self.plan.shares[index])
        server = self.plan.server_shares[index]
        if server is not None and server != self.cluster.server_share:
            self.cluster.set_server_share(server)
        self.phase = index
        self._log_phase(index, epoch_event, elapsed)

    def _log_phase(self, index: int, epoch_event: dict[str, Any] | None, elapsed: float | None = None) -> None:
        schedule = self.plan.schedule
        if schedule is None:
            return
        profile = self.plan.profiles[index]
        record: dict[str, Any] = {"event": "phase", "phase": index, "profile": profile.name, "shares": self.plan.shares[index]}
        if self.plan.server_shares[index] is not None:
            record["server_share"] = self.plan.server_shares[index]
        if schedule.every_epochs is not None:
            record["epoch"] = index * schedule.every_epochs
            where = f"after epoch {record['epoch']}"
        else:
            record["elapsed_s"] = round(elapsed if elapsed is not None else 0.0, 3)
            where = f"at {record['elapsed_s']:g} s"
        record["time"] = round(time.time(), 3)
        self.phases.append(record)
        with open(self.phases_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        heterogeneity = profile.allocation(self.plan.config.mode).heterogeneity
        self.say(
            f"phase {index + 1}/{len(self.plan.profiles)} {profile.name} (HL {heterogeneity:g}) {where}: "
            f"shares {_fmt_shares(self.plan.names, self.plan.shares[index])} cores"
        )

    # -------------------------------------------------------------- the end
    def _finish(self, summary: dict[str, Any], total_s: float, limiting: str) -> dict[str, Any]:
        plan = self.plan
        epochs = [e for e in self.events if e.get("event") == "epoch"]
        last = epochs[-1] if epochs else {}
        final_shares = plan.shares[self.phase]
        rows = []
        for name, share in zip(plan.names, final_shares, strict=True):
            rows.append({
                "worker": name,
                "share": share,
                "final_batch": (summary.get("batch_sizes") or {}).get(name),
                "compute_ms_last_epoch": (last.get("compute_ms") or {}).get(name),
            })
        labels = {n: f"{n} ({_cores(s)})" for n, s in zip(plan.names, plan.shares[0], strict=True)}
        if plan.schedule is not None:
            labels = {}
        where = f"schedule {plan.schedule.name}" if plan.schedule is not None else plan.profiles[0].name
        title = f"{where}, {plan.config.mode.upper()}, {plan.config.policy} policy"
        from deploy import plots  # matplotlib is slow to import; only needed here

        paths = plots.write_plots(self.events, plan.out, phases=self.phases, labels=labels, title=title)
        result = {
            "profile": plan.profiles[0].name if plan.schedule is None else None,
            "schedule": plan.schedule.name if plan.schedule is not None else None,
            "mode": plan.config.mode,
            "controller": plan.config.policy,
            "limiting": limiting,
            "period_us": plan.period_us,
            "server_args": plan.server_args,
            "workers": rows,
            "samples_per_s": summary.get("samples_per_s"),
            "train_wall_s": summary.get("wall_s"),
            "total_wall_s": round(total_s, 3),
            "accuracy": summary.get("accuracy"),
            "adjustments": summary.get("adjustments"),
            "epochs": summary.get("epochs"),
            "phases": self.phases,
            "plots": [str(p) for p in paths],
            "summary": summary,
        }
        summary_path = plan.out / "summary.json"
        summary_path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        self._print_summary(result)
        self.say("wrote " + ", ".join(str(p) for p in [summary_path, *paths]))
        return result

    def _print_summary(self, result: dict[str, Any]) -> None:
        share_head = "share (cores)" if self.plan.schedule is None else "final share"
        self.say("")
        measured = f"{result['summary'].get('balance') or 'compute'} ms, last epoch"
        self.say(f"{'worker':<8}{share_head:>14}{'final batch':>13}{measured:>24}")
        for row in result["workers"]:
            compute = row["compute_ms_last_epoch"]
            self.say(
                f"{row['worker']:<8}{row['share']:>14.3f}{row['final_batch'] if row['final_batch'] is not None else '-':>13}"
                f"{f'{compute:.0f}' if compute is not None else '-':>24}"
            )
        accuracy = result["accuracy"]
        self.say(
            f"throughput {result['samples_per_s']} samples/s | training {result['train_wall_s']} s "
            f"(total {result['total_wall_s']:.1f} s with startup) | final accuracy "
            + (f"{100 * accuracy:.1f}%" if accuracy is not None else "-")
            + f" | controller adjustments {result['adjustments']} | {result['limiting']}"
        )


def _last_line(path: Path) -> str:
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def run(config: RunConfig, out: TextIO = sys.stdout) -> dict[str, Any]:
    """Resolve and run; ValueError for bad input, RunFailed when the run breaks, Terminated on SIGTERM."""
    return Emulation(resolve(config), out).run()


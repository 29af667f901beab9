"""Chaos benchmark: an emulated HL4 job under a stream of faults, against the same job without them.

``python -m benchmarks.chaos --epochs 4 --fault-every 30 --json`` runs the ``ps-cluster run`` job (a
small CNN on generated images; HL4's CPU shares scaled to this machine, each worker in a cgroup with
its quota, or with --slowdown factors where cgroups are not writable: deploy.launcher.LocalCluster)
in turn, in one invocation (``--runs``):

1. ``free``: without faults;
2. ``faulted``: with a fault every ``--fault-every`` seconds, the kinds taken in turn from ``--faults``:
   ``worker-kill`` (kill -9 of a worker, started again ``--restart-after`` s later, as a cluster's
   supervisor would), ``worker-stop`` (SIGSTOP for longer than the round deadline, then SIGCONT),
   ``worker-stall`` (the worker's loop stops while its heartbeat goes on: the test hook of
   worker/probes/stall_hook.py), ``worker-partition`` (the worker's TCP connections to the server dropped on
   loopback with tc filters, re-applied to every new connection it opens, then lifted), and
   ``server-kill`` (kill -9 of ps-server, started again with ``--resume`` from its newest checkpoint);
   ``workers``: the same with the worker faults only;
3. ``membership``, fault-free: a fifth worker added at the end of epoch 1, one removed (SIGTERM: it
   leaves) at the end of epoch 2; ``plan_workers`` lists the workers of each plan that changed them.

Reported per run: faults injected by kind, whether the job finished, samples/s (epochs x training
samples over the time from the job's start to its end, server restarts included), the final test
accuracy, the longest time any round stayed open (Status polled every ``POLL_S``; a server's downtime
is counted apart), and the invariants: every plan sums to B, every round of fewer than B samples
closed while a member was removed from it, each server's step count equals the rounds it closed
after the round it started at, and, a witness apart from those counters, no sample was trained twice
in an epoch and every epoch (from the last server's first) was trained whole (the summary's
``exactly_once``). ``faulted_vs_free`` is the throughput ratio (the goal: >= 0.90 at one
worker fault per 30 s), ``workers_vs_free`` the same for the worker faults only. stdout gets the JSON (``--json``) or a table; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import multiprocessing
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from common.job.datasets import Dataset, build_dataset
from common.ops.arg_types import positive_float, positive_int
from deploy.launcher import LocalCluster, WorkerSpec
from deploy.profiles import default_cpu_budget, load_profile, scale
from deploy.run_plan import DEFAULT_DATASET_ARGS, DEFAULT_JOB
from deploy.signals import signals_as_exceptions
from worker.transport.client import PSClient, ServerError
from worker.probes.stall_hook import STALL_DIR_ENV

FAULTS = ("worker-kill", "worker-stop", "server-kill", "worker-stall", "worker-partition")
POLL_S = 0.2
SERVER_FLAGS = ["--evict-after", "3", "--round-deadline-floor", "2", "--checkpoint-every", "10",
                "--keep-checkpoints", "2", "--grace", "5", "--policy", "dynamic"]
WORKER_FLAGS = ("--retry-for", "180")


def log(message: str) -> None:
    print(f"chaos: {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Watch:
    """Status polled through a run, from a process of its own (a gRPC channel in this one would be
    inherited, half-alive, by every process it forks: the server's restart aborted): how long each
    round number stood while the server answered, and the server's downtime."""

    target: str
    path: Path
    rounds_open: list[float] = field(default_factory=list)
    down_s: float = 0.0

    def start(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._process = context.Process(target=self._run, args=(self._stop,), daemon=True)
        self._process.start()

    def stop(self) -> None:
        self._stop.set()
        self._process.join(30)
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(self.path.read_text())
            self.rounds_open, self.down_s = data["rounds_open"], data["down_s"]

    def _run(self, stop: Any) -> None:
        client = PSClient(self.target)
        last_round, since, down_since = None, time.monotonic(), None
        try:
            while not stop.wait(POLL_S):
                try:
                    s = client.status()
                except ServerError:
                    if down_since is None:
                        down_since = time.monotonic()
                    last_round = None  # a restarted server reopens its resumed round: timed afresh
                    continue
                now = time.monotonic()
                if down_since is not None:
                    self.down_s += now - down_since
                    down_since = None
                if s.round != last_round:
                    if last_round is not None:
                        self.rounds_open.append(now - since)
                    last_round, since = s.round, now
                elif s.done:
                    break
        finally:
            client.close()
            self.path.write_text(json.dumps({"rounds_open": self.rounds_open, "down_s": self.down_s}))


class Partition:
    """Drop one process's TCP traffic with the server on loopback (tc u32 filters on its ports)."""

    def __init__(self, pid: int, server_port: int) -> None:
        self.pid, self.server_port = pid, server_port
        self.ports: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)

    @staticmethod
    def available() -> bool:
        return os.geteuid() == 0 and shutil.which("tc") is not None and shutil.which("ss") is not None

    def _tc(self, *args: str) -> None:
        subprocess.run(["tc", *args], capture_output=True, check=False, timeout=10)

    def _own_ports(self) -> set[int]:
        out = subprocess.run(["ss", "-tnpH", "dport", f"= :{self.server_port}"], capture_output=True, text=True,
                             check=False, timeout=10).stdout
        return {int(line.split()[3].rsplit(":", 1)[1]) for line in out.splitlines() if f"pid={self.pid}," in line}

    def _follow(self) -> None:
        while not self._stop.is_set():
            for port in self._own_ports() - self.ports:  # its connection's two directions, nothing else
                self.ports.add(port)
                for source, dest in ((port, self.server_port), (self.server_port, port)):
                    self._tc("filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", "1", "u32",
                             "match", "ip", "sport", str(source), "0xffff", "match", "ip", "dport", str(dest), "0xffff",
                             "action", "drop")
            self._stop.wait(0.2)

    def __enter__(self) -> Partition:
        self._tc("qdisc", "add", "dev", "lo", "root", "handle", "1:", "prio")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._tc("qdisc", "del", "dev", "lo", "root")


@dataclass
class Settings:
    epochs: int
    fault_every: float
    faults: list[str]
    restart_after: float
    budget: float
    out: Path


def cluster_for(settings: Settings, run: str, port: int) -> LocalCluster:
    profile = load_profile("hl4")
    shares = scale(profile, "bsp", settings.budget)
    job = {**DEFAULT_JOB, "epochs": settings.epochs}
    server_args = ["--mode", "bsp", "--workers", str(len(shares)), "--max-workers", str(len(shares) + 1),
                   "--model", job["model"], "--dataset", job["dataset"], "--global-batch", str(job["global_batch"]),
                   "--epochs", str(job["epochs"]), "--lr", str(job["lr"]), "--port", str(port), "--quiet",
                   "--checkpoint-dir", str(settings.out / run / "ckpt"), *SERVER_FLAGS]
    for option in DEFAULT_DATASET_ARGS.get(job["dataset"], []):
        server_args += ["--dataset-arg", option]
    workers = [WorkerSpec(f"w{k}", share, extra_args=WORKER_FLAGS) for k, share in enumerate(shares)]
    return LocalCluster(server_args, workers, settings.out / run, run_id=f"chaos-{run}")


STOP_S, STALL_S, PARTITION_S = 6.0, 10.0, 8.0
"""How long a stopped, stalled or partitioned worker stays so: past --evict-after (3 s) and past the
round deadline (auto: at least --round-deadline-floor, 2 s; 4 x the median round, ~1 s, on this job)."""


def inject(cluster: LocalCluster, kind: str, victim: str, settings: Settings, port: int) -> bool:
    """One fault of `kind` on worker `victim` (unused for server-kill), undone when it is due; False
    when there was nothing to fault (the worker had exited)."""
    proc = cluster.processes.get(victim)
    if kind == "server-kill":
        assert cluster.server is not None
        cluster.server.kill()
        cluster.server.wait(10)
        time.sleep(1.0)
        cluster.restart_server("--resume", str(cluster.workdir / "ckpt"))
        return True
    if proc is None or proc.poll() is not None:
        return False
    if kind == "worker-kill":
        proc.kill()
        proc.wait(10)
        time.sleep(settings.restart_after)
        cluster.respawn_worker(victim)
    elif kind == "worker-stop":
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(STOP_S)
        os.kill(proc.pid, signal.SIGCONT)
    elif kind == "worker-stall":
        flag = Path(os.environ[STALL_DIR_ENV]) / victim
        flag.touch()
        time.sleep(STALL_S)
        flag.unlink()
    elif kind == "worker-partition":
        with Partition(proc.pid, port):
            time.sleep(PARTITION_S)
    return True


def run_job(settings: Settings, run: str) -> dict[str, Any]:
    """One run of the job (`run`: free, faulted, membership); its report."""
    port = free_port()
    cluster = cluster_for(settings, run, port)
    injected: Counter[str] = Counter()
    with cluster:
        cluster.start()
        watch = Watch(cluster.target, settings.out / run / "rounds.json")
        watch.start()
        chosen = [k for k in settings.faults if (k != "worker-partition" or Partition.available())
                  and (run != "workers" or k.startswith("worker-"))]
        kinds = itertools.cycle(chosen)
        victims = itertools.cycle([w.name for w in cluster.workers])
        started = None
        next_fault = None
        membership_done: set[int] = set()
        while True:
            if cluster.poll() is not None:  # a killed server was started again inside inject()
                break
            if started is None and cluster.events("adjust"):
                started = time.monotonic()
                next_fault = started + settings.fault_every
            due = next_fault is not None and time.monotonic() >= next_fault
            if run in ("faulted", "workers") and due and not cluster.events("end"):  # none once the job ended
                assert next_fault is not None  # (due)
                kind = next(kinds)
                victim = "server" if kind == "server-kill" else next(victims)
                log(f"{kind} on {victim} at {time.monotonic() - (started or 0):.0f} s")
                injected[kind] += inject(cluster, kind, victim, settings, port)
                next_fault += settings.fault_every  # start to start
            if run == "membership":
                epoch = max((e["epoch"] for e in cluster.events("epoch")), default=0)
                if epoch >= 1 and 1 not in membership_done:
                    membership_done.add(1)
                    cluster.add_worker(WorkerSpec("w4", cluster.shares[0], extra_args=WORKER_FLAGS))
                    log("membership: w4 added after epoch 1")
                if epoch >= 2 and 2 not in membership_done:
                    membership_done.add(2)
                    cluster.processes["w0"].terminate()
                    log("membership: w0 removed after epoch 2")
            time.sleep(POLL_S)
        watch.stop()
        events = cluster.events()
    return report(run, events, watch, injected, started)


def train_samples() -> int:
    """The job's training samples per epoch."""
    options = dict(o.split("=", 1) for o in DEFAULT_DATASET_ARGS.get(DEFAULT_JOB["dataset"], []))
    dataset = build_dataset(DEFAULT_JOB["dataset"], {k: json.loads(v) for k, v in options.items()}, 0)
    assert isinstance(dataset, Dataset), "the chaos job's dataset is held in memory"
    return len(dataset.train_x)


def exact_from(events: list[dict[str, Any]]) -> int:
    """The first epoch the last server counts whole: a resumed one counts from the epoch it resumed in."""
    resumes = [e for e in events if e["event"] == "resume"]
    return int(resumes[-1].get("epoch", 0)) if resumes else 0


def report(run: str, events: list[dict[str, Any]], watch: Watch, injected: Counter[str],
           started: float | None) -> dict[str, Any]:
    summaries = [e for e in events if e["event"] == "summary"]
    summary = summaries[-1] if summaries else {}
    plans = [e["batch_sizes"] for e in events if e["event"] == "adjust"]
    global_batch = DEFAULT_JOB["global_batch"]
    removed_in = {e["step"] for e in events if e["event"] in ("evict", "leave")}
    shorts = [e for e in events if e["event"] == "short_round"]
    first = [e for e in events if e["event"] in ("path", "join")]
    end = [e for e in events if e["event"] == "end"]
    wall = end[-1]["time"] - first[0]["time"] if first and end else None
    samples = summary.get("epochs", 0) * train_samples()
    exact = summary.get("exactly_once", {})
    return {
        "run": run,
        "finished": summary.get("reason") == "finished",
        "faults": dict(injected),
        "server_starts": 1 + sum(1 for e in events if e["event"] == "resume"),
        "wall_s": round(wall, 2) if wall else None,
        "samples_per_s": round(samples / wall, 2) if wall else None,
        "accuracy": summary.get("accuracy"),
        "longest_round_open_s": round(max(watch.rounds_open, default=0.0), 2),
        "server_down_s": round(watch.down_s, 2),
        "evictions": sum(1 for e in events if e["event"] == "evict"),
        "deadline_drops": sum(1 for e in events if e["event"] == "deadline"),
        "every_plan_sums_to_B": all(sum(p.values()) == global_batch for p in plans),
        "short_rounds": len(shorts),
        "short_rounds_all_at_a_removal": all(e["round"] in removed_in for e in shorts),
        "steps_equal_rounds_closed": summary.get("rounds") == (summary.get("first_round") or 0) + summary.get("rounds_closed", -1),
        # a second witness, kept apart from the round counters: the epochs' slices (ps/rounds/epoch_slices.py)
        # refuse a sample consumed twice in an epoch, and count every epoch trained whole
        "no_sample_trained_twice": exact.get("overlaps") == 0,
        "every_epoch_trained_once": exact.get("exact_epochs") == list(range(exact_from(events), summary.get("epochs", 0))),
        "plans": len(plans),
        "plan_workers": [sorted(p) for k, p in enumerate(plans) if k == 0 or sorted(p) != sorted(plans[k - 1])],
    }


def build_parser() -> argparse.ArgumentParser:
    """`python -m benchmarks.chaos`'s command line."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--epochs", type=positive_int, default=8, help="epochs of each run")
    p.add_argument("--fault-every", type=positive_float, default=30.0, help="seconds between faults")
    p.add_argument("--faults", default=",".join(FAULTS), help=f"fault kinds, taken in turn ({', '.join(FAULTS)})")
    p.add_argument("--restart-after", type=positive_float, default=3.0, help="seconds before a killed worker restarts")
    p.add_argument("--budget", type=positive_float, default=None, help="cores for the workers (unset: this machine's)")
    p.add_argument("--runs", default="free,faulted,workers,membership",
                   help="which runs: free (no faults), faulted (--faults), workers (--faults on workers only), membership")
    p.add_argument("--out", type=Path, default=None, help="keep the runs' logs here (unset: a temporary folder)")
    p.add_argument("--json", action="store_true", help="JSON on stdout (else a table)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    if unknown := set(faults) - set(FAULTS):
        p.error(f"--faults: unknown kinds {sorted(unknown)}")
    runs_asked = [r.strip() for r in args.runs.split(",") if r.strip()]
    if args.out is not None and any((args.out / run).exists() for run in runs_asked):
        p.error(f"--out {args.out} already holds runs (their checkpoints would be taken for this job's): give a new folder")
    out = args.out or Path(tempfile.mkdtemp(prefix="chaos-"))
    os.environ[STALL_DIR_ENV] = str(out / "stall")
    (out / "stall").mkdir(parents=True, exist_ok=True)
    settings = Settings(args.epochs, args.fault_every, faults, args.restart_after,
                        args.budget or default_cpu_budget(), out)
    runs = {}
    with signals_as_exceptions():  # SIGTERM unwinds through each cluster's close(), as Ctrl-C does
        for run in runs_asked:
            log(f"run {run}")
            runs[run] = run_job(settings, run)
    result: dict[str, Any] = {
        "benchmark": "chaos", "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "machine": platform.node(),
        "cpus": len(os.sched_getaffinity(0)), "profile": "hl4", "job": {**DEFAULT_JOB, "epochs": args.epochs},
        "fault_every_s": args.fault_every, "faults": faults, "server_flags": SERVER_FLAGS, "runs": runs,
    }
    free = runs.get("free", {})
    for run in ("faulted", "workers"):
        if free.get("samples_per_s") and runs.get(run, {}).get("samples_per_s"):
            result[f"{run}_vs_free"] = round(runs[run]["samples_per_s"] / free["samples_per_s"], 3)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for name, r in runs.items():
            print(f"{name:>10}: finished={r['finished']} samples/s={r['samples_per_s']} acc={r['accuracy']} "
                  f"longest round {r['longest_round_open_s']} s faults={r['faults']}")
        print(f"faulted/free: {result.get('faulted_vs_free')}, worker faults only/free: {result.get('workers_vs_free')}")
    with contextlib.suppress(OSError):
        (out / "chaos.json").write_text(json.dumps(result, indent=2))
    return 0 if all(r["finished"] for r in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

"""benchmarks.hostile's job and one run of it: the emulated cluster started (deploy.launcher.LocalCluster,
the profile's shares scaled as ``ps-cluster run`` scales them), an attack begun beside it once the job
has started (the server's first plan), the job followed to its end or to the run's time limit (then
stopped with SIGTERM: its summary says how far it got), and the run's record from the metrics log."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from benchmarks.hostile.load import silent_pushes, watches
from benchmarks.hostile.peers import DepartedAtShards, RejoinLoop, RoundClock, StalledPushes, StoreRewrites
from benchmarks.hostile.report import run_record
from deploy.launcher import LocalCluster, WorkerFailedError, WorkerSpec
from deploy.run_files import MetricsTail, last_line

WATCHES = 90
SILENT_PUSHES = 100
STALLERS = 3
STALL_EVERY_S = 5.0
ATTACKS: dict[str, str] = {
    "watches": f"{WATCHES} health Watch streams without the token, each opened again when it ends",
    "silent_pushes": f"{SILENT_PUSHES} Push streams that never send a chunk, with the token (past authentication, "
                     "as any caller of a job without one), each opened again when it ends",
    "stalled_pushes": f"{STALLERS} joined ids, heartbeating, each pushing its header and then an empty chunk every "
                      f"{STALL_EVERY_S:g} s; joining again when evicted",
    "rejoin_loop": "one name that joins, heartbeats, never pushes, and joins again when evicted",
    "departed_at_shards": "an id that left, pulling its ranges and staging a zero slice at every shard each round",
    "store_rewrites": "a member setting, compare-and-setting and deleting the other ranks' keys of its group's "
                      "store, then filling it; joining again when evicted",
}
NEEDS = {"departed_at_shards": "runs with --shards N (N >= 2) only: the job has no shard otherwise",
         "store_rewrites": "runs with --allreduce only: the job has no group store otherwise"}
EXTRA_MEMBERS = STALLERS
"""Places beyond the profile's workers (--max-workers) for the attackers that join: the most at once."""
START_S = 300.0
"""How long the workers may take to join and the job to start."""
STOP_S = 60.0
"""How long a stopped server may take to exit, and its workers after it."""
POLL_S = 0.2


class Attack(Protocol):
    def stop(self) -> None: ...

    def tally(self) -> dict[str, int]: ...

    def told(self) -> dict[str, str]: ...


def start_attack(name: str, target: str, token: str) -> Attack:
    """Attack `name` begun against the server at `target`."""
    if name == "watches":
        return watches(target, WATCHES)
    if name == "silent_pushes":
        return silent_pushes(target, SILENT_PUSHES, metadata=(("authorization", f"Bearer {token}"),))
    if name == "stalled_pushes":
        return StalledPushes(target, token, STALLERS, STALL_EVERY_S).start()
    if name == "rejoin_loop":
        return RejoinLoop(target, token).start()
    if name == "departed_at_shards":
        return DepartedAtShards(target, token).start()
    if name == "store_rewrites":
        return StoreRewrites(target, token).start()
    raise ValueError(f"unknown attack {name!r}: choose from {', '.join(ATTACKS)}")


@dataclass(frozen=True)
class Job:
    """What every run starts: the server's flags (the token among them), the workers and their shares."""

    server_args: tuple[str, ...]
    names: tuple[str, ...]
    shares: tuple[float, ...]
    period_us: int
    limiter: str
    token: str
    global_batch: int
    out: Path

    @property
    def worker_args(self) -> tuple[str, ...]:
        return ("--token", self.token, "--retry-for", "180")

    def cluster(self, run: str) -> LocalCluster:
        workers = [WorkerSpec(n, s, extra_args=self.worker_args) for n, s in zip(self.names, self.shares, strict=True)]
        return LocalCluster(self.server_args, workers, self.out / run, period_us=self.period_us, limiter=self.limiter,
                            run_id=f"hostile-{run}")


def wait_for_start(cluster: LocalCluster) -> None:
    """Until the server's first plan (every worker joined); RuntimeError if it exits or a worker fails first."""
    deadline = time.monotonic() + START_S
    while not cluster.events("adjust"):
        code = cluster.poll()
        if code is not None:
            raise RuntimeError(f"the server exited ({code}) before the job started: "
                               f"{last_line(cluster.workdir / 'server.log')}")
        try:
            cluster.check_workers()
        except WorkerFailedError as exc:
            raise RuntimeError(str(exc)) from exc
        if time.monotonic() > deadline:
            raise TimeoutError(f"the job did not start within {START_S:g} s (see {cluster.workdir})")
        time.sleep(POLL_S)


def stop_server(cluster: LocalCluster) -> None:
    """SIGTERM: the server ends the job (`stopping`), writes its summary and exits."""
    assert cluster.server is not None
    cluster.server.send_signal(signal.SIGTERM)
    wait_server(cluster)


def wait_server(cluster: LocalCluster) -> None:
    """Until the server exits, STOP_S at most (then close() kills it; without a summary the record
    says the job did not finish)."""
    assert cluster.server is not None
    try:
        cluster.server.wait(STOP_S)
    except subprocess.TimeoutExpired:
        pass


def worker_exits(cluster: LocalCluster) -> dict[str, int | None]:
    """Each worker's exit status once the server is gone (None: it was still running after STOP_S)."""
    deadline = time.monotonic() + STOP_S
    exits: dict[str, int | None] = {}
    for name, proc in cluster.processes.items():
        try:
            exits[name] = proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            exits[name] = None
    return exits


def run_once(job: Job, attack: str | None, timeout_s: float, log: Any) -> dict[str, Any]:
    """The job once, clean (`attack` None) or with `attack` beside it from its start; its record."""
    run = attack or "clean"
    attacker: Attack | None = None
    timed_out = False
    with job.cluster(run) as cluster:
        cluster.start()
        wait_for_start(cluster)
        begun = time.monotonic()
        clock = RoundClock(cluster.target, job.token).start()
        open_at_end = None
        try:
            if attack is not None:
                attacker = start_attack(attack, cluster.target, job.token)
            tail = MetricsTail(cluster.metrics_path)
            while not any(e.get("event") == "end" for e in tail.read()) and cluster.poll() is None:
                if time.monotonic() - begun >= timeout_s:
                    break
                time.sleep(POLL_S)
            if cluster.poll() is None and not cluster.events("end"):
                open_at_end = clock.open_for()
                timed_out = True
                log(f"{run}: not finished within {timeout_s:g} s: stopping the server")
                stop_server(cluster)
        finally:
            clock.stop()
            if attacker is not None:  # at the job's end: what it was answered after would be the shutdown's
                attacker.stop()
        wait_server(cluster)
        exits = worker_exits(cluster)
        events = cluster.events()
    record = run_record(run, events, exits, timed_out, attacker.tally() if attacker else {}, job.global_batch, open_at_end)
    record["attacker_told"] = attacker.told() if attacker else {}
    return record


def chosen_attacks(asked: Sequence[str] | None, shards: int, allreduce: bool) -> tuple[list[str], dict[str, str]]:
    """The attacks to run and those skipped, with why: the ones the job cannot have unless asked for."""
    possible = {"departed_at_shards": shards >= 2, "store_rewrites": allreduce}
    names = list(asked) if asked else [a for a in ATTACKS if possible.get(a, True)]
    refused = [a for a in names if not possible.get(a, True)]
    if refused:
        raise ValueError("; ".join(f"--attacks {a} {NEEDS[a]}" for a in refused))
    return names, {a: NEEDS[a] for a in ATTACKS if a not in names and a in NEEDS}
